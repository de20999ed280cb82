"""Usage per vNPU: memory and die time from the per-die ledgers, sessions from the aclserver.

Memory in use and die microseconds consumed come from each share's ledger entry (cheap: one
mmap per die; only aclservers write it, with figures they measured). The session count comes
from the small ``<uid>.ready.sessions`` file the aclserver rewrites when a session opens or
closes (``flexnpu_runtime/aclserver/server.py``). ``Sampler`` turns consumed microseconds into a
percent of the die since the previous sample. Best effort: what cannot be read is reported as
unknown (-1); nothing here raises.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dra_driver import files
from dra_driver.errors import FlexNPUError
from flexnpu_runtime.aclserver import ledger

__all__ = ["LedgerReader", "Sampler", "ShareFigures", "sessions"]

log = logging.getLogger("flexnpu.daemon")


@dataclass(frozen=True, slots=True)
class ShareFigures:
    mem_used: int
    consumed_us: int


class LedgerReader:
    """(claim UID, virtual ID) → figures of every live ledger entry on the dies asked, with the die
    ledgers kept open between calls (one mmap per die)."""

    def __init__(self, ledger_dir: Path) -> None:
        self.ledger_dir = ledger_dir
        self._open: dict[int, ledger.DieLedger] = {}
        self._lock = threading.Lock()

    def figures(self, _ledger_dir: Path, dies: Iterable[int]) -> dict[tuple[str, int], ShareFigures]:
        out: dict[tuple[str, int], ShareFigures] = {}
        with self._lock:
            for die in sorted(set(dies)):
                try:
                    handle = self._open.get(die)
                    if handle is None:
                        if not Path(ledger.ledger_path(str(self.ledger_dir), die)).exists():
                            continue
                        handle = self._open[die] = ledger.DieLedger(str(self.ledger_dir), die, create=False)
                    entries = handle.snapshot()
                except (FlexNPUError, OSError, ValueError) as exc:
                    log.debug("cannot read the ledger of die %d: %s", die, exc)
                    self._drop(die)
                    continue
                for e in entries:
                    out[(e.claim_uid, e.virtual_id)] = ShareFigures(e.mem_used, e.consumed_us)
        return out

    def _drop(self, die: int) -> None:
        handle = self._open.pop(die, None)
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()


def sessions(path: Path) -> int:
    """The session count an aclserver recorded in ``path``; -1 when unknown."""
    try:
        return int(files.read_nofollow(path, max_bytes=64).decode().strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return -1


class Sampler:
    """Percent of the die a vNPU used between two samples of its consumed microseconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[tuple[str, int], tuple[float, int]] = {}

    def percent(self, key: tuple[str, int], consumed_us: int, *, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        with self._lock:
            prev = self._last.get(key)
            self._last[key] = (now, consumed_us)
        if prev is None or now <= prev[0] or consumed_us < prev[1]:
            return -1
        return min(100, round(100 * (consumed_us - prev[1]) / ((now - prev[0]) * 1e6)))

    def forget(self, live: Iterable[tuple[str, int]]) -> None:
        keep = set(live)
        with self._lock:
            self._last = {k: v for k, v in self._last.items() if k in keep}
