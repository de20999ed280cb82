"""Data types of the daemon API: shares, registration requests, registered entities.

Pure data with JSON round-trips (the registry stores them). Shared by the daemon, its client
and ``flexnpu-smi``; nothing here touches the world.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dra_driver.errors import ErrorCode, InvalidInput
from flexnpu_wire import shares
from flexnpu_wire.codes import Policy


class EntityState(StrEnum):
    STARTING = "Starting"
    RUNNING = "Running"
    EXITED = "Exited"
    UNKNOWN = "Unknown"


Share = shares.Share
"""One vNPU of a claim: the one share record of ``client/flexnpu_wire/shares.py``."""


@dataclass(frozen=True, slots=True)
class RegisterRequest:
    """What the kubelet plugin asks for one claim. Two requests are identical iff equal."""

    claim_uid: str
    namespace: str
    name: str
    token: str
    shares: tuple[Share, ...]
    tcp_host: str = ""  # empty: the daemon's --tcp-host

    def to_dict(self) -> dict[str, Any]:
        return {
            "claim_uid": self.claim_uid,
            "namespace": self.namespace,
            "name": self.name,
            "token": self.token,
            "shares": [s.to_dict() for s in self.shares],
            "tcp_host": self.tcp_host,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> RegisterRequest:
        return cls(
            claim_uid=str(doc["claim_uid"]),
            namespace=str(doc.get("namespace", "")),
            name=str(doc.get("name", "")),
            token=str(doc["token"]),
            shares=tuple(Share.from_dict(s) for s in doc["shares"]),
            tcp_host=str(doc.get("tcp_host", "")),
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
class Entity:
    """One registered claim and its aclserver process group, as the registry records it.

    ``pid`` is also the process group ID (the aclserver starts its own session).
    ``pid_start_time`` (clock ticks since boot, /proc/<pid>/stat field 22) and ``cmdline``
    tell our process apart from a later one that reused the PID.
    """

    request: RegisterRequest
    state: EntityState
    endpoints: Endpoints
    pid: int = 0
    pid_start_time: int = 0
    cmdline: tuple[str, ...] = ()
    restarts: int = 0
    started_at: float = 0.0
    message: str = ""

    @property
    def claim_uid(self) -> str:
        return self.request.claim_uid

    def to_dict(self) -> dict[str, Any]:
        return {
            "request": self.request.to_dict(),
            "state": str(self.state),
            "endpoints": self.endpoints.to_dict(),
            "pid": self.pid,
            "pid_start_time": self.pid_start_time,
            "cmdline": list(self.cmdline),
            "restarts": self.restarts,
            "started_at": self.started_at,
            "message": self.message,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Entity:
        return cls(
            request=RegisterRequest.from_dict(doc["request"]),
            state=EntityState(doc["state"]),
            endpoints=Endpoints.from_dict(doc.get("endpoints", {})),
            pid=int(doc.get("pid", 0)),
            pid_start_time=int(doc.get("pid_start_time", 0)),
            cmdline=tuple(str(a) for a in doc.get("cmdline", ())),
            restarts=int(doc.get("restarts", 0)),
            started_at=float(doc.get("started_at", 0.0)),
            message=str(doc.get("message", "")),
        )


# ---- what the API returns (client side and flexnpu-smi) ----


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


@dataclass(frozen=True, slots=True)
class HealthInfo:
    ok: bool
    pid: int
    version: str
    entities: int
    dies: int
    started_at: float
    die_ids: tuple[int, ...] = ()
    """Physical IDs of the dies served now (empty from a daemon older than this field)."""


@dataclass(frozen=True, slots=True)
class DieCapacity:
    """What the daemon needs to know about a die to validate quotas."""

    phy_id: int
    memory_bytes: int
    healthy: bool = True


def parse_policy(value: str, *, claim_uid: str, field_name: str) -> Policy:
    """The policy named ``value``, or an :class:`InvalidInput` naming the claim and field."""
    try:
        return Policy(value)
    except ValueError:
        raise InvalidInput(
            f"unknown policy {value!r}; use one of {', '.join(p.value for p in Policy)}",
            code=ErrorCode.INVALID_ARGUMENT,
            claim_uid=claim_uid,
            field=field_name,
        ) from None
