"""The ``client.conf`` format: what the container's client library needs to reach its aclserver.

Versioned JSON (``"version": 1``), documented in docs/client-conf.md. The kubelet plugin renders
it (``render``) into the per-claim config that is mounted read-only at /etc/flexnpu/client.conf;
the client library parses it (``parse``/``load``). Paths are as seen INSIDE the container.
Pure apart from ``load``, which reads one file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from flexnpu_wire.codes import Policy
from flexnpu_wire.errors import ContractError, Unreadable

__all__ = [
    "CONF_VERSION",
    "DEFAULT_PATH",
    "ENV_VAR",
    "ClientConf",
    "Endpoints",
    "ShareInfo",
    "load",
    "parse",
    "render",
]

CONF_VERSION = 1
DEFAULT_PATH = "/etc/flexnpu/client.conf"
ENV_VAR = "FLEXNPU_CONF"
_MAX_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Endpoints:
    """The control link: a unix socket path and/or a TCP ``host:port`` (at least one)."""

    unix: str | None = None
    tcp: str | None = None

    @property
    def tcp_address(self) -> tuple[str, int] | None:
        """(host, port) of ``tcp``; IPv6 hosts are written ``[addr]:port``."""
        if self.tcp is None:
            return None
        host, _, port = self.tcp.rpartition(":")
        return host.strip("[]"), int(port)


@dataclass(frozen=True, slots=True)
class ShareInfo:
    """One vNPU of the claim as the container sees it (device ``virtual_id``)."""

    virtual_id: int
    memory_bytes: int
    compute_percent: int
    policy: Policy
    memory_only: bool = False


@dataclass(frozen=True, slots=True)
class ClientConf:
    """A parsed client.conf."""

    claim_uid: str
    token: str
    endpoints: Endpoints
    shm_dir: str
    shares: tuple[ShareInfo, ...]
    version: int = CONF_VERSION
    soc_name: str = ""
    """The dies' SoC name (``Ascend910B3``, ...) that ``aclrtGetSocName`` answers; "" when unknown."""


def render(conf: ClientConf) -> str:
    """The JSON text of ``conf`` (stable key order; ``parse`` round-trips it)."""
    endpoints: dict[str, str] = {}
    if conf.endpoints.unix is not None:
        endpoints["unix"] = conf.endpoints.unix
    if conf.endpoints.tcp is not None:
        endpoints["tcp"] = conf.endpoints.tcp
    doc: dict[str, Any] = {
        "version": conf.version,
        "claim_uid": conf.claim_uid,
        "token": conf.token,
        "endpoints": endpoints,
        "shm_dir": conf.shm_dir,
        "shares": [
            {
                "virtual_id": s.virtual_id,
                "memory_bytes": s.memory_bytes,
                "compute_percent": s.compute_percent,
                "policy": str(s.policy),
                "memory_only": s.memory_only,
            }
            for s in conf.shares
        ],
    }
    if conf.soc_name:
        doc["soc_name"] = conf.soc_name
    return json.dumps(doc, indent=2) + "\n"


def parse(text: str, *, source: str) -> ClientConf:
    """Parse and validate client.conf text; every error names ``source`` and the field."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise _bad(source, None, f"is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise _bad(source, None, "must hold a JSON object")
    version = doc.get("version")
    if version != CONF_VERSION:
        raise _bad(source, "version", f"must be {CONF_VERSION}, got {version!r}")
    claim_uid = _string(source, doc, "claim_uid")
    token = _string(source, doc, "token")
    shm_dir = _string(source, doc, "shm_dir")
    if not shm_dir.startswith("/"):
        raise _bad(source, "shm_dir", f"must be an absolute path, got {shm_dir!r}", claim_uid)
    raw_ep = doc.get("endpoints")
    if not isinstance(raw_ep, dict):
        raise _bad(source, "endpoints", "must be an object with 'unix' and/or 'tcp'", claim_uid)
    unknown = set(raw_ep) - {"unix", "tcp"}
    if unknown:
        raise _bad(
            source, f"endpoints.{sorted(unknown)[0]}", "is not a known endpoint (unix, tcp)", claim_uid
        )
    unix = _string(source, raw_ep, "unix", prefix="endpoints.") if "unix" in raw_ep else None
    tcp = _string(source, raw_ep, "tcp", prefix="endpoints.") if "tcp" in raw_ep else None
    if unix is None and tcp is None:
        raise _bad(source, "endpoints", "needs at least one of 'unix' and 'tcp'", claim_uid)
    if unix is not None and not unix.startswith("/"):
        raise _bad(source, "endpoints.unix", f"must be an absolute path, got {unix!r}", claim_uid)
    if tcp is not None:
        host, sep, port = tcp.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise _bad(source, "endpoints.tcp", f"must be host:port, got {tcp!r}", claim_uid)
    raw_shares = doc.get("shares")
    if not isinstance(raw_shares, list) or not raw_shares:
        raise _bad(source, "shares", "must be a non-empty list", claim_uid)
    shares = tuple(_share(source, claim_uid, raw, i) for i, raw in enumerate(raw_shares))
    if sorted(s.virtual_id for s in shares) != list(range(len(shares))):
        raise _bad(source, "shares", f"virtual_id values must be 0..{len(shares) - 1} once each", claim_uid)
    soc_name = doc.get("soc_name", "")
    if not isinstance(soc_name, str) or len(soc_name) > _SOC_NAME_MAX or not soc_name.isascii():
        raise _bad(
            source, "soc_name", f"must be an ASCII string of at most {_SOC_NAME_MAX} characters", claim_uid
        )
    return ClientConf(
        claim_uid=claim_uid,
        token=token,
        endpoints=Endpoints(unix=unix, tcp=tcp),
        shm_dir=shm_dir,
        shares=shares,
        version=version,
        soc_name=soc_name,
    )


def load(path: str | os.PathLike[str] | None = None) -> ClientConf:
    """Load client.conf from ``path``, else ``$FLEXNPU_CONF``, else /etc/flexnpu/client.conf."""
    chosen = str(path) if path is not None else os.environ.get(ENV_VAR) or DEFAULT_PATH
    try:
        with open(chosen, "rb") as fh:
            raw = fh.read(_MAX_BYTES + 1)
    except OSError as exc:
        raise Unreadable(f"cannot read client.conf {chosen}: {exc.strerror}", source=chosen) from exc
    if len(raw) > _MAX_BYTES:
        raise Unreadable(f"client.conf {chosen} is larger than {_MAX_BYTES} bytes", source=chosen)
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise Unreadable(f"client.conf {chosen} is not UTF-8: {exc}", source=chosen) from exc
    return parse(text, source=chosen)


def _share(source: str, claim_uid: str, raw: object, index: int) -> ShareInfo:
    prefix = f"shares[{index}]."
    if not isinstance(raw, dict):
        raise _bad(source, f"shares[{index}]", "must be an object", claim_uid)
    values: dict[str, int] = {}
    for key, lo, hi in (("virtual_id", 0, None), ("memory_bytes", 1, None), ("compute_percent", 0, 100)):
        value = raw.get(key)
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < lo
            or (hi is not None and value > hi)
        ):
            raise _bad(
                source,
                prefix + key,
                f"must be an integer >= {lo}" + (f" and <= {hi}" if hi else "") + f", got {value!r}",
                claim_uid,
            )
        values[key] = value
    try:
        policy = Policy(str(raw.get("policy")))
    except ValueError:
        raise _bad(
            source,
            prefix + "policy",
            f"must be one of fixed, elastic, best-effort, got {raw.get('policy')!r}",
            claim_uid,
        ) from None
    memory_only = raw.get("memory_only", False)
    if not isinstance(memory_only, bool):
        raise _bad(source, prefix + "memory_only", "must be true or false", claim_uid)
    return ShareInfo(policy=policy, memory_only=memory_only, **values)


_SOC_NAME_MAX = 63
"""The C client's buffer (libascendcl/src/conf.h) holds 63 characters and the terminator."""


def _string(source: str, doc: dict[str, Any], key: str, *, prefix: str = "") -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value:
        raise _bad(source, prefix + key, "must be a non-empty string")
    return value


def _bad(source: str, field: str | None, message: str, claim_uid: str | None = None) -> ContractError:
    where = f"field {field} " if field else ""
    return ContractError(
        f"client.conf {source}: {where}{message}", source=source, claim_uid=claim_uid, field=field
    )
