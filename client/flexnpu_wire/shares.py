"""The share record: one vNPU of a claim (a memory and compute quota on one die).

The kubelet plugin builds it, the daemon API carries it (``api_protos``), the daemon registry
stores it and the aclserver launch spec hands it to the aclserver: one type for all of them.
``policy`` and ``priority`` hold the names as given (the daemon refuses unknown names with an error
naming the field before anything starts); :attr:`Share.priority_enum` is the priority as its enum.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flexnpu_wire.codes import Priority

__all__ = ["MAX_HOST_MEMORY_BYTES", "Share"]

MAX_HOST_MEMORY_BYTES = 1 << 40
"""Largest host-memory limit of one vNPU (1 TiB): the limit sizes a tmpfs and bounds the aclserver."""


@dataclass(frozen=True, slots=True)
class Share:
    """One vNPU of a claim: the container sees it as device ``virtual_id``."""

    virtual_id: int
    die_phy_id: int
    memory_bytes: int
    compute_percent: int
    policy: str
    memory_only: bool = False
    host_memory_bytes: int = 0
    """This vNPU's part of the claim's host-memory limit (``hostMemory``); 0: its memory quota."""
    priority: str = str(Priority.NORMAL)
    """When its work gets the die (``latency-critical``, ``normal``, ``batch``); "" reads as normal."""

    @property
    def host_memory_limit(self) -> int:
        """Host memory (aclrtMallocHost buffers, model bytes in flight) this vNPU adds to the claim's limit."""
        return self.host_memory_bytes or self.memory_bytes

    @property
    def priority_enum(self) -> Priority:
        """The priority as an enum (ValueError for an unknown name; "" is normal: a record from before)."""
        return Priority(self.priority or Priority.NORMAL)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "virtual_id": self.virtual_id,
            "die_phy_id": self.die_phy_id,
            "memory_bytes": self.memory_bytes,
            "compute_percent": self.compute_percent,
            "policy": str(self.policy),
            "memory_only": self.memory_only,
        }
        if self.host_memory_bytes:  # absent when unset: records written before the field read the same
            doc["host_memory_bytes"] = self.host_memory_bytes
        if self.priority and self.priority != Priority.NORMAL:  # absent when normal, as before the field
            doc["priority"] = str(self.priority)
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Share:
        return cls(
            virtual_id=int(doc["virtual_id"]),
            die_phy_id=int(doc["die_phy_id"]),
            memory_bytes=int(doc["memory_bytes"]),
            compute_percent=int(doc["compute_percent"]),
            policy=str(doc["policy"]),
            memory_only=bool(doc.get("memory_only", False)),
            host_memory_bytes=int(doc.get("host_memory_bytes", 0)),
            priority=str(doc.get("priority", Priority.NORMAL)),
        )
