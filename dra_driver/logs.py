"""Logging setup: a formatter that always carries the claim UID, and per-claim adapters.

Process-wide lines show ``claim=-``; lines about a claim show ``claim=<uid> ns/name``.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

ClaimLogger = logging.LoggerAdapter[logging.Logger]


class _ClaimFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for key in ("claim_uid", "claim"):
            if not hasattr(record, key):
                setattr(record, key, "-")
        return True


class _Adapter(logging.LoggerAdapter[logging.Logger]):
    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        extra: dict[str, Any] = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        return msg, kwargs


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "claim_uid": getattr(record, "claim_uid", "-"),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def claim_logger(
    uid: str, namespace: str = "", name: str = "", *, base: logging.Logger | None = None
) -> ClaimLogger:
    """A logger adapter whose lines carry the claim UID (and namespace/name when known)."""
    ref = f"{uid} {namespace}/{name}" if name else uid
    extra: Mapping[str, object] = {"claim_uid": uid, "claim": ref}
    return _Adapter(base or logging.getLogger("flexnpu"), extra)


def setup(level: str = "INFO", *, json_format: bool = False) -> None:
    """Configure the root logger once per process."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ClaimFilter())
    if json_format:
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s claim=%(claim)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
