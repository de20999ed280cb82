"""Whether a node process instance is serving: the kubelet registered it and its pool is published.

The contract between the node process (the writer, ``kubeletplugin/readiness.py``) and the readiness
probe (``python3 -m dra_driver.probes plugin``, the reader): one small JSON file per instance,
``<run-dir>/plugins/<instance>.ready`` (the instance is the pod UID of a rolling-update pod, else
``default``), replaced atomically on every change and removed when the instance stops. A file, not
the metrics port: during a rolling update the old instance may still hold the port, and its answer
would speak for the new one.

Ready means both of: the kubelet's ``NotifyRegistrationStatus`` said registered (and has not said
otherwise since), and one complete pool publish succeeded since the process started. Until then
the probe fails naming what is missing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dra_driver import files

__all__ = ["State", "path_for", "read", "remove", "write"]

MAX_BYTES = 4096


@dataclass(frozen=True, slots=True)
class State:
    registered: bool = False
    published: bool = False
    pid: int = 0

    @property
    def ready(self) -> bool:
        return self.registered and self.published

    def missing(self) -> str:
        """What keeps it from being ready, as a phrase ('' when ready)."""
        parts = []
        if not self.registered:
            parts.append("the kubelet has not registered it")
        if not self.published:
            parts.append("no complete pool has been published yet")
        return " and ".join(parts)


def path_for(run_dir: Path, pod_uid: str | None) -> Path:
    return run_dir / "plugins" / f"{pod_uid or 'default'}.ready"


def write(path: Path, state: State) -> None:
    body = json.dumps({"registered": state.registered, "published": state.published, "pid": state.pid})
    files.write_atomic(path, body.encode(), mode=0o644, sync=False, dir_mode=0o755)


def read(path: Path) -> State | None:
    """The recorded state, or None when no instance wrote one (not started, or stopped)."""
    try:
        doc = json.loads(files.read_nofollow(path, max_bytes=MAX_BYTES))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return State()
    if not isinstance(doc, dict):
        return State()
    return State(
        registered=doc.get("registered") is True,
        published=doc.get("published") is True,
        pid=int(doc["pid"]) if isinstance(doc.get("pid"), int) else 0,
    )


def remove(path: Path) -> None:
    files.remove_nofollow(path)
