"""The daemon's settings: where things live, how long to wait, how far an aclserver may go.

One frozen value built once by ``main`` from the flags; every part of the daemon reads it and
none changes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flexnpu_runtime.daemon import bounds, launch_spec, registry
from flexnpu_wire.launch import DEFAULT_MAX_SESSIONS, DEFAULT_MAX_SHARES_PER_DIE, DEFAULT_STAGING_BYTES

__all__ = ["Settings"]


@dataclass(frozen=True, slots=True)
class Settings:
    """Where things live and how long to wait (built once by ``main``)."""

    state_dir: Path
    run_dir: Path
    shm_root: Path
    tcp_host: str
    ready_timeout: float = 10.0
    stop_timeout: float = 2.0
    monitor_interval: float = 0.5
    max_restarts: int = 1
    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_shares_per_die: int = DEFAULT_MAX_SHARES_PER_DIE
    shm_mount: bool = False
    """Each claim's shm dir is its own tmpfs, sized from its quota (needs CAP_SYS_ADMIN)."""
    shm_problem: str = ""
    """Why that bound cannot be kept here (``flexnpu_runtime/daemon/shmroot.py``): no aclserver starts."""
    memory_overhead_bytes: int = bounds.DEFAULT_MEMORY_OVERHEAD_BYTES
    """What an aclserver's memory bound allows beyond its claim's quotas (``flexnpu_runtime/daemon/bounds.py``)."""
    staging_bytes: int = DEFAULT_STAGING_BYTES
    owner: str = ""
    """This daemon state's install identity (``flexnpu_runtime/daemon/ownership.py``), on each cgroup it makes."""

    @property
    def registry_file(self) -> Path:
        return self.state_dir / registry.FILE_NAME

    @property
    def lock_file(self) -> Path:
        """Held by the one daemon instance that owns this state (``flexnpu_runtime/daemon/instance.py``)."""
        return self.state_dir / "daemon.lock"

    @property
    def ledger_dir(self) -> Path:
        return self.shm_root / launch_spec.LEDGER_DIR_NAME

    def paths(self, claim_uid: str) -> launch_spec.ClaimPaths:
        return launch_spec.claim_paths(claim_uid, run_dir=self.run_dir, shm_root=self.shm_root)
