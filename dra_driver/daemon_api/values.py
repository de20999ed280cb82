"""The value types of the node ↔ daemon contract: what both ends (and ``flexnpu-smi``) exchange.

Registration requests and results, the endpoints of a claim's aclserver, the entities ``List``
reports with their usage, the daemon's health, and the shm root's layout both rely on. Pure data
with JSON round-trips (the daemon's registry stores requests and endpoints). The domain core
(``records``, ``render``, ``sweep``, ``usage_metrics``) and the kubelet plugin import these from
here, never from the runtime in ``flexnpu_runtime/daemon/``; the protobuf conversions are
``dra_driver/daemon_api/wire.py``. A share is the wire package's ``flexnpu_wire.shares.Share``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from flexnpu_wire.shares import Share

__all__ = [
    "LEDGER_DIR_NAME",
    "Endpoints",
    "EntityInfo",
    "EntityState",
    "HealthInfo",
    "RegisterRequest",
    "RegisterResult",
    "ShareUsage",
]

LEDGER_DIR_NAME = ".ledger"
"""The directory under the shm root that holds the per-die compute ledgers of the aclservers."""


class EntityState(StrEnum):
    STARTING = "Starting"
    RUNNING = "Running"
    EXITED = "Exited"
    UNKNOWN = "Unknown"


@dataclass(frozen=True, slots=True)
class RegisterRequest:
    """What the kubelet plugin asks for one claim. Two requests are identical iff equal."""

    claim_uid: str
    namespace: str
    name: str
    token: str
    shares: tuple[Share, ...]
    tcp_host: str = ""  # empty: the daemon's --tcp-host
    tcp_port: int = field(default=0, compare=False)
    """The TCP port to listen on if it is free (0: any). A wish, not part of the request's
    identity: the node passes the recorded one when it registers a claim again (healing)."""
    unix_only: bool = False
    """The claim asked for the unix socket only (``transport: unix``): no TCP listener."""

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "claim_uid": self.claim_uid,
            "namespace": self.namespace,
            "name": self.name,
            "token": self.token,
            "shares": [s.to_dict() for s in self.shares],
            "tcp_host": self.tcp_host,
        }
        if self.tcp_port:
            doc["tcp_port"] = self.tcp_port
        if self.unix_only:
            doc["unix_only"] = True
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> RegisterRequest:
        return cls(
            claim_uid=str(doc["claim_uid"]),
            namespace=str(doc.get("namespace", "")),
            name=str(doc.get("name", "")),
            token=str(doc["token"]),
            shares=tuple(Share.from_dict(s) for s in doc["shares"]),
            tcp_host=str(doc.get("tcp_host", "")),
            tcp_port=int(doc.get("tcp_port", 0)),
            unix_only=bool(doc.get("unix_only", False)),
        )


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where a claim's aclserver listens."""

    tcp_host: str = ""
    tcp_port: int = 0
    unix_socket: str = ""
    shm_dir: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "tcp_host": self.tcp_host,
            "tcp_port": self.tcp_port,
            "unix_socket": self.unix_socket,
            "shm_dir": self.shm_dir,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Endpoints:
        return cls(
            tcp_host=str(doc.get("tcp_host", "")),
            tcp_port=int(doc.get("tcp_port", 0)),
            unix_socket=str(doc.get("unix_socket", "")),
            shm_dir=str(doc.get("shm_dir", "")),
        )


@dataclass(frozen=True, slots=True)
class RegisterResult:
    entity_id: str
    pid: int
    endpoints: Endpoints
    existing: bool = False


@dataclass(frozen=True, slots=True)
class ShareUsage:
    share: Share
    """Usage of one vNPU (virtual id ``share.virtual_id``); quotas are ``share.memory_bytes`` and
    ``share.compute_percent``. -1 means unknown."""

    memory_used_bytes: int = -1
    compute_used_percent: int = -1
    """Percent of the die used since the previous ``List`` (-1 on the first)."""
    compute_used_us: int = -1
    """Die microseconds used since the aclserver started."""
    sessions: int = -1
    """Client sessions open on the claim's aclserver."""


@dataclass(frozen=True, slots=True)
class EntityInfo:
    """One vNPU group as ``List`` reports it."""

    entity_id: str
    namespace: str
    name: str
    shares: tuple[ShareUsage, ...]
    pid: int
    state: EntityState
    endpoints: Endpoints
    restarts: int = 0
    rss_bytes: int = -1
    started_at: float = 0.0
    message: str = ""
    cgroup: str = ""
    """The aclserver's own cgroup below each hierarchy's root; "" when it has none (unbounded)."""
    memory_current_bytes: int = -1
    memory_max_bytes: int = -1
    memory_peak_bytes: int = -1
    tasks_current: int = -1
    tasks_max: int = -1
    cpu_weight: int = -1
    """On the cgroup v2 scale (100 = default)."""
    oom_kills: int = -1


@dataclass(frozen=True, slots=True)
class HealthInfo:
    ok: bool
    pid: int
    version: str
    entities: int
    dies: int
    started_at: float
    shm_problem: str = ""  # why a share's shm dir cannot be bounded ("": it can, or --shm-mount never)
    adopted: bool = True
    """The registry was recovered (every live aclserver re-adopted) and the API serves."""
    cgroups: str = ""
    """Where aclservers get their own cgroups ("" when they do not)."""
    cgroup_problem: str = ""
    """Why aclservers run unbounded in the daemon's cgroup ("" when they have their own)."""
    instance: str = ""
    """The daemon instance (its pod UID, ``--instance``) that answers."""
    die_ids: tuple[int, ...] = ()
    """Physical IDs of the dies served now (empty from a daemon older than this field)."""
