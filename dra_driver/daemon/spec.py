"""Pure: where a claim's files live and what its aclserver launch spec says.

The spec format is the launch contract with ``dra_driver.aclserver`` (version 1): JSON, mode
0600, one aclserver per claim serving all of its shares. This module only builds the data;
``processes`` writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.daemon.model import RegisterRequest

SPEC_VERSION = 1
LEDGER_DIR_NAME = ".ledger"
MAX_FRAME_BYTES = 1024 * 1024
BACKEND = "emulated"


@dataclass(frozen=True, slots=True)
class ClaimPaths:
    """Every path the daemon creates for one claim (all removed at unregister)."""

    shm_dir: Path
    unix_socket: Path
    spec: Path
    ready: Path
    stderr: Path

    def files(self) -> tuple[Path, ...]:
        return (self.spec, self.ready, self.stderr)


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
    )


def specs_dir(run_dir: Path) -> Path:
    return run_dir / "aclservers"


def claim_uid_of_file(name: str) -> str:
    """The claim UID a file in the specs dir belongs to (UIDs have no dots; see validation)."""
    return name.lstrip(".").split(".", 1)[0]


def build_spec(
    request: RegisterRequest, *, paths: ClaimPaths, shm_root: Path, tcp_host: str, tcp_port: int = 0
) -> dict[str, Any]:
    """The JSON document the aclserver reads with ``--spec``."""
    return {
        "version": SPEC_VERSION,
        "claim_uid": request.claim_uid,
        "token": request.token,
        "shm_dir": str(paths.shm_dir),
        "unix_socket": str(paths.unix_socket),
        "tcp_host": tcp_host,
        "tcp_port": tcp_port,
        "ledger_dir": str(shm_root / LEDGER_DIR_NAME),
        "ready_file": str(paths.ready),
        "backend": BACKEND,
        "max_frame_bytes": MAX_FRAME_BYTES,
        "shares": [s.to_dict() for s in request.shares],
    }
