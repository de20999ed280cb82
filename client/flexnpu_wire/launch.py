"""The aclserver launch spec (written by flexnpu-daemon, mode 0600) and the ready file it answers with.

Owns the JSON format, strict parsing (every error names the file and the field) and rendering.
Pure: the daemon writes the spec and the aclserver writes the ready file with the atomic writer
of ``dra_driver/files.py``, one call per effect (``dra_driver/wirefiles.py``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from flexnpu_wire.codes import Policy, Priority
from flexnpu_wire.errors import ContractError
from flexnpu_wire.shares import Share

__all__ = [
    "BACKENDS",
    "DEFAULT_AUTH_TIMEOUT_MS",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_MAX_SHARES_PER_DIE",
    "DEFAULT_STAGING_BYTES",
    "MAX_UNIX_PATH",
    "MIN_FRAME_BYTES",
    "SPEC_VERSION",
    "AclServerSpec",
    "ReadyInfo",
    "ShareSpec",
    "parse_ready",
    "parse_spec",
    "render_ready",
    "render_spec",
]

SPEC_VERSION = 1
DEFAULT_STAGING_BYTES = 8 * 1024 * 1024
"""Per-session staging region. Its two 4 MiB halves stay in the CPU cache between the client's
copy and the server's (measured: 64 MiB staged in 4.1 ms with 8 MiB, 5.2 ms with 16 MiB)."""
DEFAULT_AUTH_TIMEOUT_MS = 10_000
"""A connection that has not authenticated (HELLO with the token) this long after connect is closed."""
DEFAULT_MAX_FRAME_BYTES = 1024 * 1024
DEFAULT_MAX_SESSIONS = 16
"""Authenticated sessions one claim's aclserver serves at once (any processes of the pod)."""
DEFAULT_MAX_CONNECTIONS = 64
"""Connections one aclserver holds at once on each listener: ``max_sessions`` authenticated ones
and ``max_connections - max_sessions`` that have not authenticated yet (per listener; a TCP peer
holds a few of them at most); more are closed at accept."""
DEFAULT_MAX_SHARES_PER_DIE = 63
"""Shares one die's ledger admits (CANN allows at most 63 user processes per A2/A3 device)."""
MIN_FRAME_BYTES = 4096
MAX_UNIX_PATH = 107
BACKENDS = ("emulated",)


ShareSpec = Share
"""The launch spec's share is the one share record (``flexnpu_wire/shares.py``)."""


@dataclass(frozen=True, slots=True)
class AclServerSpec:
    """Everything one aclserver needs; see docs in the module docstring of ``main``."""

    claim_uid: str
    token: str
    shm_dir: str
    unix_socket: str
    tcp_host: str
    tcp_port: int
    ledger_dir: str
    ready_file: str
    shares: tuple[ShareSpec, ...]
    backend: str = "emulated"
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    staging_bytes: int = DEFAULT_STAGING_BYTES
    auth_timeout_ms: int = DEFAULT_AUTH_TIMEOUT_MS
    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_shares_per_die: int = DEFAULT_MAX_SHARES_PER_DIE
    process_name: str = ""
    """What ``ps`` shows for the aclserver (empty: ``flexnpu-aclserver <claim uid>``)."""
    tcp_listen: bool = True
    """Whether the aclserver listens on TCP at all (False: a claim whose transport is ``unix``
    gets no TCP listener; its ready file says port 0)."""
    version: int = SPEC_VERSION

    @property
    def host_memory_limit(self) -> int:
        """Host memory the claim's sessions may hold at once (the sum over its vNPUs)."""
        return sum(s.host_memory_limit for s in self.shares)


@dataclass(frozen=True, slots=True)
class ReadyInfo:
    """What the aclserver writes to ``ready_file`` once both endpoints listen."""

    pid: int
    tcp_host: str
    tcp_port: int
    unix_socket: str
    started_at: float


_REQUIRED = (
    "version",
    "claim_uid",
    "token",
    "shm_dir",
    "unix_socket",
    "tcp_host",
    "tcp_port",
    "ledger_dir",
    "ready_file",
    "shares",
)
_OPTIONAL = (
    "backend",
    "max_frame_bytes",
    "staging_bytes",
    "auth_timeout_ms",
    "max_sessions",
    "max_connections",
    "max_shares_per_die",
    "process_name",
    "tcp_listen",
)
_SHARE_FIELDS = ("virtual_id", "die_phy_id", "memory_bytes", "compute_percent", "policy")
_SHARE_OPTIONAL = ("memory_only", "host_memory_bytes", "priority")


def parse_spec(text: str, *, source: str) -> AclServerSpec:
    """Parse and validate a spec document; ``source`` (the file path) appears in every error."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise _bad(source, None, f"is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise _bad(source, None, "must hold a JSON object")
    uid = doc.get("claim_uid") if isinstance(doc.get("claim_uid"), str) else None
    p = _Fields(source, uid)
    p.check_keys(doc, _REQUIRED, _OPTIONAL, prefix="")
    version = p.integer(doc, "version", lo=1)
    if version != SPEC_VERSION:
        raise p.bad("version", f"unsupported spec version {version} (this aclserver reads {SPEC_VERSION})")
    claim_uid = p.string(doc, "claim_uid")
    token = p.string(doc, "token")
    if len(token) < 16 or any(c not in "0123456789abcdefABCDEF" for c in token):
        raise p.bad("token", "must be a hex string of at least 16 characters")
    paths = {name: p.abspath(doc, name) for name in ("shm_dir", "unix_socket", "ledger_dir", "ready_file")}
    if len(paths["unix_socket"].encode()) > MAX_UNIX_PATH:
        raise p.bad("unix_socket", f"is longer than {MAX_UNIX_PATH} bytes (a unix socket path limit)")
    tcp_host = p.string(doc, "tcp_host")
    tcp_port = p.integer(doc, "tcp_port", lo=0, hi=65535)
    backend = p.string(doc, "backend") if "backend" in doc else "emulated"
    if backend not in BACKENDS:
        raise p.bad("backend", f"unknown backend {backend!r} (available: {', '.join(BACKENDS)})")
    max_frame = (
        p.integer(doc, "max_frame_bytes", lo=MIN_FRAME_BYTES)
        if "max_frame_bytes" in doc
        else DEFAULT_MAX_FRAME_BYTES
    )
    staging = p.integer(doc, "staging_bytes", lo=4096) if "staging_bytes" in doc else DEFAULT_STAGING_BYTES
    auth_timeout = (
        p.integer(doc, "auth_timeout_ms", lo=100, hi=3_600_000)
        if "auth_timeout_ms" in doc
        else DEFAULT_AUTH_TIMEOUT_MS
    )
    max_sessions = (
        p.integer(doc, "max_sessions", lo=1, hi=1024) if "max_sessions" in doc else DEFAULT_MAX_SESSIONS
    )
    max_connections = (
        p.integer(doc, "max_connections", lo=max_sessions + 1, hi=65_536)
        if "max_connections" in doc
        else max(DEFAULT_MAX_CONNECTIONS, max_sessions + 8)
    )
    max_shares = (
        p.integer(doc, "max_shares_per_die", lo=1, hi=1024)
        if "max_shares_per_die" in doc
        else DEFAULT_MAX_SHARES_PER_DIE
    )
    tcp_listen = doc.get("tcp_listen", True)
    if not isinstance(tcp_listen, bool):
        raise p.bad("tcp_listen", "must be true or false")
    process_name = doc.get("process_name", "")
    if not isinstance(process_name, str) or len(process_name) > 200:
        raise p.bad("process_name", "must be a string of at most 200 characters")
    raw_shares = doc["shares"]
    if not isinstance(raw_shares, list) or not raw_shares:
        raise p.bad("shares", "must be a non-empty list")
    shares = tuple(_parse_share(p, raw, i) for i, raw in enumerate(raw_shares))
    ids = sorted(s.virtual_id for s in shares)
    if ids != list(range(len(shares))):
        raise p.bad("shares", f"virtual_id values must be 0..{len(shares) - 1} once each, got {ids}")
    return AclServerSpec(
        claim_uid=claim_uid,
        token=token,
        tcp_host=tcp_host,
        tcp_port=tcp_port,
        shares=shares,
        backend=backend,
        max_frame_bytes=max_frame,
        staging_bytes=staging,
        auth_timeout_ms=auth_timeout,
        max_sessions=max_sessions,
        max_connections=max_connections,
        max_shares_per_die=max_shares,
        process_name=process_name,
        tcp_listen=tcp_listen,
        version=version,
        **paths,
    )


def render_spec(spec: AclServerSpec) -> str:
    """The JSON text of a spec (what the daemon writes; ``parse_spec`` round-trips it)."""
    doc: dict[str, Any] = asdict(spec)
    doc["shares"] = [{**asdict(s), "policy": str(s.policy)} for s in spec.shares]
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def render_ready(info: ReadyInfo) -> str:
    """The JSON text of a ready file (``parse_ready`` round-trips it)."""
    return json.dumps(asdict(info)) + "\n"


def parse_ready(text: str, *, source: str) -> ReadyInfo:
    """Parse a ready file's text."""
    try:
        doc = json.loads(text)
        return ReadyInfo(
            pid=int(doc["pid"]),
            tcp_host=str(doc["tcp_host"]),
            tcp_port=int(doc["tcp_port"]),
            unix_socket=str(doc["unix_socket"]),
            started_at=float(doc["started_at"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ContractError(f"{source}: malformed aclserver ready file: {exc}", source=source) from exc


def _parse_share(p: _Fields, raw: object, index: int) -> ShareSpec:
    prefix = f"shares[{index}]."
    if not isinstance(raw, dict):
        raise p.bad(f"shares[{index}]", "must be an object")
    p.check_keys(raw, _SHARE_FIELDS, _SHARE_OPTIONAL, prefix=prefix)
    policy_text = p.string(raw, "policy", prefix=prefix)
    try:
        policy = Policy(policy_text)
    except ValueError:
        allowed = ", ".join(str(x) for x in Policy)
        raise p.bad(prefix + "policy", f"unknown policy {policy_text!r} (one of {allowed})") from None
    priority = p.string(raw, "priority", prefix=prefix) if "priority" in raw else str(Priority.NORMAL)
    if priority not in set(Priority):
        allowed = ", ".join(str(x) for x in Priority)
        raise p.bad(prefix + "priority", f"unknown priority {priority!r} (one of {allowed})")
    memory_only = raw.get("memory_only", False)
    if not isinstance(memory_only, bool):
        raise p.bad(prefix + "memory_only", "must be true or false")
    return Share(
        virtual_id=p.integer(raw, "virtual_id", lo=0, prefix=prefix),
        die_phy_id=p.integer(raw, "die_phy_id", lo=0, prefix=prefix),
        memory_bytes=p.integer(raw, "memory_bytes", lo=1, prefix=prefix),
        compute_percent=p.integer(raw, "compute_percent", lo=0, hi=100, prefix=prefix),
        policy=policy,
        memory_only=memory_only,
        host_memory_bytes=p.integer(raw, "host_memory_bytes", lo=0, prefix=prefix)
        if "host_memory_bytes" in raw
        else 0,
        priority=priority,
    )


class _Fields:
    """Typed field readers that raise ContractError naming the file, claim and field."""

    def __init__(self, source: str, claim_uid: str | None) -> None:
        self.source = source
        self.claim_uid = claim_uid

    def bad(self, field: str, message: str) -> ContractError:
        return _bad(self.source, field, message, self.claim_uid)

    def check_keys(
        self, doc: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...], *, prefix: str
    ) -> None:
        for key in required:
            if key not in doc:
                raise self.bad(prefix + key, "is required")
        for key in doc:
            if key not in required and key not in optional:
                raise self.bad(prefix + str(key), "is not a known field")

    def string(self, doc: dict[str, Any], key: str, *, prefix: str = "") -> str:
        value = doc.get(key)
        if not isinstance(value, str) or not value:
            raise self.bad(prefix + key, "must be a non-empty string")
        return value

    def abspath(self, doc: dict[str, Any], key: str) -> str:
        value = self.string(doc, key)
        if not value.startswith("/"):
            raise self.bad(key, f"must be an absolute path, got {value!r}")
        return value

    def integer(
        self, doc: dict[str, Any], key: str, *, lo: int | None = None, hi: int | None = None, prefix: str = ""
    ) -> int:
        value = doc.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.bad(prefix + key, f"must be an integer, got {value!r}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f"{lo if lo is not None else '-inf'}..{hi if hi is not None else 'inf'}"
            raise self.bad(prefix + key, f"must be in {bounds}, got {value}")
        return value


def _bad(source: str, field: str | None, message: str, claim_uid: str | None = None) -> ContractError:
    where = f"{source}: " + (f"field {field} " if field else "")
    return ContractError(f"aclserver spec {where}{message}", source=source, claim_uid=claim_uid, field=field)
