"""Pure: where a claim's files live and what its aclserver launch spec says.

The spec is the typed launch contract of ``client/flexnpu_wire/launch.py`` (version 1): JSON,
mode 0600, one aclserver per claim serving all of its shares. This module only builds the
value; ``aclservers.py`` writes it in one call (``dra_driver/wirefiles.py`` ``write_spec``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dra_driver.daemon_api.values import LEDGER_DIR_NAME, RegisterRequest
from flexnpu_wire.launch import (
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_SHARES_PER_DIE,
    SPEC_VERSION,
    AclServerSpec,
)

__all__ = [
    "BACKEND",
    "LEDGER_DIR_NAME",
    "MAX_FRAME_BYTES",
    "SPEC_VERSION",
    "ClaimPaths",
    "build_spec",
    "claim_paths",
    "claim_uid_of_file",
    "process_name",
    "specs_dir",
]

MAX_FRAME_BYTES = DEFAULT_MAX_FRAME_BYTES
BACKEND = "emulated"


@dataclass(frozen=True, slots=True)
class ClaimPaths:
    """Every path the daemon creates for one claim (all removed at unregister)."""

    shm_dir: Path
    unix_socket: Path
    spec: Path
    ready: Path
    stderr: Path
    sessions: Path

    def files(self) -> tuple[Path, ...]:
        return (self.spec, self.ready, self.stderr, self.sessions)


def claim_paths(claim_uid: str, *, run_dir: Path, shm_root: Path) -> ClaimPaths:
    """Paths for ``claim_uid`` (already validated to be a safe file name)."""
    shm_dir = shm_root / claim_uid
    specs = run_dir / "aclservers"
    return ClaimPaths(
        shm_dir=shm_dir,
        unix_socket=shm_dir / "aclserver.sock",
        spec=specs / f"{claim_uid}.spec.json",
        ready=specs / f"{claim_uid}.ready.json",
        stderr=specs / f"{claim_uid}.stderr.log",
        sessions=specs / f"{claim_uid}.ready.sessions",
    )


def specs_dir(run_dir: Path) -> Path:
    return run_dir / "aclservers"


def claim_uid_of_file(name: str) -> str:
    """The claim UID a file in the specs dir belongs to (UIDs have no dots; see validation)."""
    return name.lstrip(".").split(".", 1)[0]


def process_name(claim_uid: str) -> str:
    """What ``ps`` shows for a claim's aclserver (``pgrep aclserver`` finds it)."""
    return f"flexnpu-aclserver {claim_uid}"


def build_spec(
    request: RegisterRequest,
    *,
    paths: ClaimPaths,
    shm_root: Path,
    tcp_host: str,
    tcp_port: int = 0,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    max_shares_per_die: int = DEFAULT_MAX_SHARES_PER_DIE,
) -> AclServerSpec:
    """The launch spec the aclserver reads with ``--spec``."""
    return AclServerSpec(
        claim_uid=request.claim_uid,
        token=request.token,
        shm_dir=str(paths.shm_dir),
        unix_socket=str(paths.unix_socket),
        tcp_host=tcp_host,
        tcp_port=tcp_port,
        ledger_dir=str(shm_root / LEDGER_DIR_NAME),
        ready_file=str(paths.ready),
        shares=request.shares,
        backend=BACKEND,
        max_frame_bytes=MAX_FRAME_BYTES,
        max_sessions=max_sessions,
        max_shares_per_die=max_shares_per_die,
        process_name=process_name(request.claim_uid),
        tcp_listen=not request.unix_only,
        version=SPEC_VERSION,
    )
