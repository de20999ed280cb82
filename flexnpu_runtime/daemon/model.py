"""The daemon's own data types: the registry's entity record and the die capacities quotas are checked against.

The types the node shares with the daemon (registration requests and results, endpoints, the
entities ``List`` reports, health) are ``dra_driver/daemon_api/values.py``.
Pure data with JSON round-trips (the registry stores them); nothing here touches the world.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.daemon_api.values import (
    Endpoints,
    EntityState,
    RegisterRequest,
)
from dra_driver.errors import ErrorCode, InvalidInput
from flexnpu_wire.codes import Policy, Priority

__all__ = ["DieCapacity", "Entity", "parse_policy", "parse_priority"]


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
    cgroup: str = ""
    """The aclserver's cgroup below each hierarchy's root ("" when it runs in the daemon's)."""
    oom_kills: int = 0
    """OOM kills its cgroup had counted when this process started (a higher count later: killed by it)."""

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
            "cgroup": self.cgroup,
            "oom_kills": self.oom_kills,
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
            cgroup=str(doc.get("cgroup", "")),
            oom_kills=int(doc.get("oom_kills", 0)),
        )


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


def parse_priority(value: str, *, claim_uid: str, field_name: str) -> Priority:
    """The priority named ``value`` ("" is normal: a node of the release before priorities), or an
    :class:`InvalidInput` naming the claim and field."""
    try:
        return Priority(value or Priority.NORMAL)
    except ValueError:
        raise InvalidInput(
            f"unknown priority {value!r}; use one of {', '.join(p.value for p in Priority)}",
            code=ErrorCode.INVALID_ARGUMENT,
            claim_uid=claim_uid,
            field=field_name,
        ) from None
