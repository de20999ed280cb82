"""Pure: how far one aclserver may go on the host — its cgroup's memory, task and CPU figures.

An aclserver holds, in its own host memory, what its tenant may legitimately make it hold plus
its own interpreter:

* the claim's device-memory quota (the emulated backend keeps device memory in host memory; on
  the Ascend backend this part is slack),
* its host-memory limit (VnpuConfig ``hostMemory``: ``aclrtMallocHost`` buffers it maps),
* one staging region per session,
* a fixed overhead for the process itself (``--aclserver-memory-overhead-mib``; the idle
  aclserver's PSS is about 13 MiB, a busy one with 16 sessions about 40 MiB).

That sum is its cgroup's ``memory.max`` (v1 ``memory.limit_in_bytes``), with no swap on top.
Tasks (``pids.max``, threads included): for each session a session thread, at most 64 waiter
threads and one kernel worker per device it uses — every vNPU of the claim — plus a base. So the
bound grows with the claim's vNPU count (issue 25, class 10: a 16-vNPU claim's session needs 81
tasks, more than a fixed 72 per session allowed). CPU weight (v2 ``cpu.weight``, 100 =
the default of every other cgroup): the claim's compute quota in percent of a die, summed over
its vNPUs, at least :data:`MIN_CPU_WEIGHT` so that its control path stays responsive; a claim
of memory-only vNPUs gets the default. Nothing here touches the world.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flexnpu_wire.shares import Share

__all__ = [
    "BASE_TASKS",
    "DEFAULT_CPU_WEIGHT",
    "DEFAULT_MEMORY_OVERHEAD_BYTES",
    "MIN_CPU_WEIGHT",
    "TASKS_PER_SESSION",
    "WAITERS_PER_SESSION",
    "Bounds",
    "bounds_for",
    "tasks_per_session",
]

MIB = 1024 * 1024
DEFAULT_MEMORY_OVERHEAD_BYTES = 128 * MIB
BASE_TASKS = 64
WAITERS_PER_SESSION = 64
"""The most waiter threads one session starts (``flexnpu_runtime/aclserver/server.py`` ``_MAX_WAITERS``)."""
TASKS_PER_SESSION = 1 + WAITERS_PER_SESSION
"""A session's tasks besides its kernel workers: its own thread and its waiters."""


def tasks_per_session(devices: int) -> int:
    """The most tasks one session of a claim with ``devices`` vNPUs runs: its thread, its waiters
    and one kernel worker per device (``flexnpu_runtime/aclserver/streams.py``)."""
    return TASKS_PER_SESSION + max(1, devices)


DEFAULT_CPU_WEIGHT = 100
MIN_CPU_WEIGHT = 10
MAX_CPU_WEIGHT = 10000


@dataclass(frozen=True, slots=True)
class Bounds:
    """One aclserver's cgroup figures."""

    memory_bytes: int
    tasks: int
    cpu_weight: int
    """On the cgroup v2 scale (1..10000, default 100)."""

    @property
    def cpu_shares(self) -> int:
        """The same weight on the cgroup v1 ``cpu.shares`` scale (2..262144, default 1024)."""
        return max(2, self.cpu_weight * 1024 // DEFAULT_CPU_WEIGHT)


def bounds_for(
    shares: Sequence[Share], *, max_sessions: int, staging_bytes: int, overhead_bytes: int
) -> Bounds:
    """The bounds of the aclserver serving ``shares`` (see the module docstring)."""
    memory = sum(s.memory_bytes + s.host_memory_limit for s in shares)
    memory += max_sessions * staging_bytes + overhead_bytes
    compute = [s.compute_percent for s in shares if not s.memory_only]
    weight = min(MAX_CPU_WEIGHT, max(MIN_CPU_WEIGHT, sum(compute))) if compute else DEFAULT_CPU_WEIGHT
    tasks = BASE_TASKS + max_sessions * tasks_per_session(len(shares))
    return Bounds(memory_bytes=memory, tasks=tasks, cpu_weight=weight)
