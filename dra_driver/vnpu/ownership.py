"""The ledger of vNPUs this driver made: the proof of ownership the sweep needs.

A vNPU is written here (its ID and the claim UID) *before* it is created and removed only after
it is destroyed, in ``<state-dir>/hard-vnpus.json`` (atomic writes and a timed lock from
``dra_driver/files.py``). A vNPU that exists but is not in the ledger was made outside the
driver: it is published as held capacity and reported, never destroyed. A ledger that cannot be
read reads as "unknown" (None), and then nothing is destroyed.
"""

from __future__ import annotations

import json
from pathlib import Path

from dra_driver import files
from dra_driver.errors import ErrorCode, StateError

__all__ = ["FILE_NAME", "add", "load", "remove", "unreadable"]

FILE_NAME = "hard-vnpus.json"
LOCK_TIMEOUT_SECONDS = 10.0


def load(state_dir: Path) -> dict[int, str] | None:
    """vNPU ID -> claim UID; ``{}`` when there is no ledger, None when it cannot be read."""
    try:
        raw = json.loads(files.read_nofollow(state_dir / FILE_NAME))
        return {int(k): str(v) for k, v in dict(raw).items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError):
        return None


def unreadable(claim_uid: str, consequence: str) -> StateError:
    """The error for a ledger that :func:`load` could not read: ``consequence`` says what waits for it."""
    return StateError(
        f"the ledger of vNPUs this driver made cannot be read; {consequence}",
        code=ErrorCode.VNPU_FAILED,
        claim_uid=claim_uid,
        field=FILE_NAME,
    )


def add(state_dir: Path, vnpu_id: int, claim_uid: str) -> None:
    """Record that the driver is about to make ``vnpu_id`` for ``claim_uid``."""
    _change(state_dir, vnpu_id, claim_uid)


def remove(state_dir: Path, vnpu_id: int) -> None:
    """Forget ``vnpu_id`` (after it was destroyed, or proven never made)."""
    _change(state_dir, vnpu_id, None)


def _change(state_dir: Path, vnpu_id: int, claim_uid: str | None) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    with files.locked(state_dir / f"{FILE_NAME}.lock", timeout=LOCK_TIMEOUT_SECONDS):
        current = load(state_dir)
        if current is None:
            raise files.FileError(f"the vNPU ledger {state_dir / FILE_NAME} cannot be read")
        if claim_uid is None:
            current.pop(vnpu_id, None)
        else:
            current[vnpu_id] = claim_uid
        data = json.dumps({str(k): v for k, v in sorted(current.items())}, indent=1).encode()
        # A record is durable before its vNPU is made; a removal need not be (a record whose vNPU
        # is gone and whose claim has no entry is dropped by the sweep).
        files.write_atomic(state_dir / FILE_NAME, data, mode=0o600, sync=claim_uid is not None)
