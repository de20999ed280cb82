"""The claim's host-memory budget: every byte of host memory a tenant makes the aclserver hold.

One ``HostBudget`` per aclserver, shared by its sessions and handed to whom books host memory:
``memory.Memory`` (host buffers of the data link and staging regions) and ``model_bytes.ModelBytes``
(model bytes in flight). The limit is the launch spec's ``host_memory_limit`` (``hostMemory``
of the claim's VnpuConfig, by default its device memory quota). Device memory is the quota
book's (``quota.py``), never this budget.
"""

from __future__ import annotations

import threading

from flexnpu_runtime.aclserver.backend import AclFailure
from flexnpu_wire import codes

__all__ = ["MAX_HOST_BUFFERS", "HostBudget"]

MAX_HOST_BUFFERS = 256
"""Host buffers of one claim at once (each is a region file and a mapping)."""


class HostBudget:
    """Bytes and buffers of host memory booked against one limit; thread-safe."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._bytes = 0
        self._buffers = 0

    def reserve(self, size: int, *, buffer: bool = True) -> None:
        """Book ``size`` bytes against the limit (AclFailure 207001 if over; ``buffer``: it is one
        more host buffer, also bounded in number)."""
        with self._lock:
            if self._bytes + size > self.limit or (buffer and self._buffers >= MAX_HOST_BUFFERS):
                raise AclFailure(
                    codes.ACL_ERROR_RT_MEMORY_ALLOCATION,
                    f"host memory of {size} bytes refused: {self._bytes} bytes in {self._buffers}"
                    f" host buffers already, the limit is {self.limit} bytes (the claim's hostMemory)"
                    f" and {MAX_HOST_BUFFERS} buffers",
                )
            self._bytes += size
            self._buffers += buffer

    def release(self, size: int, *, buffer: bool = True) -> None:
        with self._lock:
            self._bytes -= size
            self._buffers -= buffer
