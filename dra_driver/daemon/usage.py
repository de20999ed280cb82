"""Memory in use per vNPU, read from the aclservers' per-die ledgers (cheap: one mmap per die).

Best effort: a die without a ledger, or a ledger that cannot be read, reports nothing, and the
caller shows "unknown". Never raises.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from dra_driver.aclserver import ledger
from dra_driver.errors import FlexNPUError

log = logging.getLogger("flexnpu.daemon")


def memory_used(ledger_dir: Path, dies: Iterable[int]) -> dict[tuple[str, int], int]:
    """(claim UID, virtual ID) → bytes in use, for every live ledger entry on ``dies``."""
    out: dict[tuple[str, int], int] = {}
    for die in sorted(set(dies)):
        try:
            entries = ledger.read_entries(str(ledger_dir), die)
        except (FlexNPUError, OSError, ValueError) as exc:
            log.debug("cannot read the ledger of die %d: %s", die, exc)
            continue
        for e in entries:
            out[(e.claim_uid, e.virtual_id)] = e.mem_used
    return out
