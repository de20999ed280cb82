"""The die ledger's file: opening, mapping, locking, growth, entries and the liveness of their aclservers.

One mmap'ed file per die (``<ledger_dir>/die-<phy>.ledger``), shared by every aclserver on that die and
read by flexnpu-daemon, the node's metrics and ``flexnpu-smi``. What its bytes mean — a header (magic,
version, die, busy_until, busy_slot, slots, capacity; since version 2 last_start, lc_until and the die's
two open grants) then ``capacity`` fixed-size entries, one per vNPU an aclserver serves on the die (pid,
process start time, claim, share, quota, policy, memory_only, waiting flag, period use, consumed time,
memory use, kernel count; since version 2 also priority, slices preempted, the queueing-delay histogram
and how far its last two grants moved) — and their codec are ``ledger_format.py``'s. ``LedgerFile`` owns
the file: it maps it, locks it (``flock`` plus a thread lock), reads and writes entries and the fields a
grant changes, grows the file, follows another opener's growth, and drops the entries of dead or zombie
pids (so a SIGKILL'd server's reservation disappears). What the entries *mean* for the die's time —
registration rules and grants — is ``ledger.DieLedger``'s, built on this class.

**Version 2** (priorities) has larger entries. A version-1 file is rewritten as version 2 when none
of its aclservers lives any more; while one does, a new aclserver on that die is refused with a
StateError naming the file (restart the old claim's aclserver, or wait for it to go).

``capacity`` (entries) starts at ``slots`` (the die's aclserver limit) and doubles when an aclserver's
vNPUs need more, up to ``slots * MAX_VNPUS_PER_ACLSERVER``; an opener re-maps when it sees the file grew.
A file written before ``capacity`` existed reads 0 there and has ``slots`` entries (64 when ``slots``
reads 0 too, the first format); a process of that release sees only the first ``slots`` entries.
"""

from __future__ import annotations

import bisect
import dataclasses
import fcntl
import mmap
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dra_driver.errors import StateError, Unavailable
from flexnpu_runtime.aclserver import ledger_format as fmt
from flexnpu_runtime.aclserver import scheduling
from flexnpu_runtime.aclserver.ledger_format import LedgerEntry, Mine, OpenGrant

__all__ = ["LedgerFile", "ledger_path", "starttime"]

_LIVENESS_EVERY_S = 0.2


def ledger_path(ledger_dir: str, die_phy_id: int) -> str:
    return os.path.join(ledger_dir, f"die-{die_phy_id}.ledger")


class LedgerFile:
    """An open die ledger file (see the module docstring). One instance per die per process; thread-safe.

    ``clock`` is what the ledger reads as now (CLOCK_MONOTONIC seconds; a test passes its own)."""

    slots: int  # the die's aclserver limit, as the file records it
    capacity: int  # entries the file holds now

    def __init__(
        self,
        ledger_dir: str,
        die_phy_id: int,
        *,
        max_shares: int,
        create: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.die = die_phy_id
        self.path = ledger_path(ledger_dir, die_phy_id)
        self.max_shares = max_shares
        if create:
            Path(ledger_dir).mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
        self._fd = os.open(self.path, flags, 0o600)
        self._tlock = threading.Lock()
        self._clock = clock
        self._last_liveness = -_LIVENESS_EVERY_S
        try:
            with self._tlock:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
                try:
                    self._open_mapping(max_shares, create=create)
                finally:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
        except BaseException:
            os.close(self._fd)
            raise

    def _open_mapping(self, max_shares: int, *, create: bool) -> None:
        size = os.fstat(self._fd).st_size
        head = os.pread(self._fd, fmt.HEADER_SIZE, 0) if size >= fmt.HEADER_SIZE else b""
        if len(head) == fmt.HEADER_SIZE and head[:8] == fmt.MAGIC:
            (_magic, version, _die, _busy, _slot) = fmt.HEADER.unpack_from(head, 0)
            if version == fmt.VERSION:
                self._map_existing(head, size)
                return
            # a file of the release before priorities may start afresh once none of its aclservers lives
            if version != 1 or not create or _v1_has_live_entries(self._fd, head, size):
                raise StateError(
                    f"ledger {self.path} has version {version}, expected {fmt.VERSION}"
                    + (
                        ": an aclserver of the previous release still runs on this die"
                        if version == 1
                        else ""
                    )
                )
        self._create_mapping(max_shares)

    def _map_existing(self, head: bytes, size: int) -> None:
        (slots,) = fmt.COUNT.unpack_from(head, fmt.SLOTS_OFFSET)
        (capacity,) = fmt.COUNT.unpack_from(head, fmt.CAPACITY_OFFSET)
        self.slots = slots or fmt.MAX_ENTRIES
        self.capacity = max(capacity, self.slots)
        if size < fmt.file_size(self.capacity):
            os.ftruncate(self._fd, fmt.file_size(self.capacity))
        self._mm = mmap.mmap(self._fd, fmt.file_size(self.capacity))

    def _create_mapping(self, max_shares: int) -> None:
        self.slots = self.capacity = max_shares
        os.ftruncate(self._fd, 0)
        os.ftruncate(self._fd, fmt.file_size(self.capacity))
        self._mm = mmap.mmap(self._fd, fmt.file_size(self.capacity))
        self._mm[: fmt.file_size(self.capacity)] = bytes(fmt.file_size(self.capacity))
        fmt.init_header(self._mm, self.die, self.slots)

    def _follow_growth(self) -> None:
        """Map the whole file again when another opener grew it (called with the file locked)."""
        (capacity,) = fmt.COUNT.unpack_from(self._mm, fmt.CAPACITY_OFFSET)
        if capacity > self.capacity:
            self._mm.close()
            self.capacity = capacity
            self._mm = mmap.mmap(self._fd, fmt.file_size(capacity))

    def _grow(self, claim_uid: str) -> int:
        """Double the entries (file locked); the first new entry, or Unavailable at the ceiling."""
        ceiling = self.slots * fmt.MAX_VNPUS_PER_ACLSERVER
        if self.capacity >= ceiling:
            raise Unavailable(
                f"die {self.die}'s ledger holds {self.capacity} vNPUs, the most its {self.slots} aclservers"
                f" may serve ({fmt.MAX_VNPUS_PER_ACLSERVER} each)",
                claim_uid=claim_uid,
                field="vnpus",
            )
        first, capacity = self.capacity, min(ceiling, self.capacity * 2)
        os.ftruncate(self._fd, fmt.file_size(capacity))  # new entries read as zero: free
        self._mm.close()
        self._mm = mmap.mmap(self._fd, fmt.file_size(capacity))
        self.capacity = capacity
        fmt.COUNT.pack_into(self._mm, fmt.CAPACITY_OFFSET, capacity)
        return first

    # -- entries ------------------------------------------------------------------------------

    def entries(self) -> list[LedgerEntry]:
        with self._locked():
            return self._live_entries(force=True)

    def snapshot(self) -> list[LedgerEntry]:
        """Every used entry as written, dead pids included (no liveness check, no writes)."""
        with self._locked():
            return [e for e in (self._decode(i) for i in self._used()) if e is not None]

    def close(self) -> None:
        try:
            self._mm.close()
        finally:
            os.close(self._fd)

    # -- internals --------------------------------------------------------------------------------

    def _set_waiting(self, slot: int, waiting: bool) -> None:
        with self._locked():
            if self._mm[self._offset(slot)]:
                self._write_fields(slot, waiting=waiting)

    def _locked(self) -> _Lock:
        return _Lock(self._tlock, self._fd, self._follow_growth)

    def _used(self) -> list[int]:
        """Entries in use: the first byte of each entry, read in one strided slice."""
        flags = self._mm[fmt.HEADER_SIZE : fmt.HEADER_SIZE + self.capacity * fmt.ENTRY.size : fmt.ENTRY.size]
        return [i for i, flag in enumerate(flags) if flag]

    @staticmethod
    def _offset(slot: int) -> int:
        return fmt.HEADER_SIZE + slot * fmt.ENTRY.size  # ledger_format.offset, without a second call

    def _decode(self, slot: int) -> LedgerEntry | None:
        return fmt.decode(self._mm, slot)

    def _write_fields(self, slot: int, **changes: Any) -> None:
        entry = self._decode(slot)
        if entry is not None:
            self._write_entry(dataclasses.replace(entry, **changes))

    def _write_entry(self, e: LedgerEntry) -> None:
        """Write all of ``e`` into its slot (file locked); the slot is in use from then on."""
        off = fmt.offset(e.slot)
        self._mm[off : off + fmt.ENTRY.size] = fmt.encode(e)

    # -- the fields a grant reads and writes (file locked) ------------------------------------------

    def _die_state(self) -> tuple[float, int, float, float]:
        """busy_until, busy_slot, last_start, lc_until: the end and holder of the die's last grant,
        its start, and the end of the last inserted (prioritized) slice."""
        _magic, _v, _d, busy_until, busy_slot = fmt.HEADER.unpack_from(self._mm, 0)
        (last_start,) = fmt.D.unpack_from(self._mm, fmt.LAST_START_AT)
        (lc_until,) = fmt.D.unpack_from(self._mm, fmt.LC_UNTIL_AT)
        return busy_until, busy_slot, last_start, lc_until

    def _set_die_state(
        self,
        *,
        busy_until: float,
        busy_slot: int,
        last_start: float | None = None,
        lc_until: float | None = None,
    ) -> None:
        fmt.HEADER.pack_into(self._mm, 0, fmt.MAGIC, fmt.VERSION, self.die, busy_until, busy_slot)
        if last_start is not None:
            fmt.D.pack_into(self._mm, fmt.LAST_START_AT, last_start)
        if lc_until is not None:
            fmt.D.pack_into(self._mm, fmt.LC_UNTIL_AT, lc_until)

    def _open_grants(self) -> list[OpenGrant]:
        """The die's two open grants as written (slot -1: none)."""
        return [
            OpenGrant(*fmt.OPEN.unpack_from(self._mm, fmt.OPENS_AT + i * fmt.OPEN.size)) for i in range(2)
        ]

    def _write_open(self, i: int, g: OpenGrant) -> None:
        fmt.OPEN.pack_into(
            self._mm, fmt.OPENS_AT + i * fmt.OPEN.size, g.slot, int(g.splittable), g.orig, g.start, g.end
        )

    def _in_use(self, slot: int) -> bool:
        return bool(self._mm[self._offset(slot)])

    def _free(self, slot: int) -> None:
        self._mm[self._offset(slot)] = 0

    def _write_grant(
        self,
        slot: int,
        *,
        period_idx: int,
        period_used_us: int,
        consumed_us: int,
        kernels: int,
        last_grant: float,
    ) -> None:
        """A grant's changes to its entry, only those fields (no longer waiting)."""
        off = self._offset(slot)
        self._mm[off + fmt.WAITING_AT] = 0
        self._write_period(slot, period_idx, period_used_us, consumed_us)
        fmt.COUNTS.pack_into(self._mm, off + fmt.COUNTS_AT, kernels, last_grant)

    def _write_period(self, slot: int, period_idx: int, period_used_us: int, consumed_us: int) -> None:
        """The entry's use of the die: in which period, how much of it, how much in all (only those)."""
        fmt.PERIOD.pack_into(
            self._mm, self._offset(slot) + fmt.PERIOD_AT, period_idx, period_used_us, consumed_us
        )

    def _count_delay(self, slot: int, waited: float, delay_sum_us: int) -> None:
        """One more task in the queueing-delay bucket of ``waited`` seconds; the new sum."""
        off = self._offset(slot)
        bucket = bisect.bisect_left(fmt.DELAY_BUCKETS_S, waited)  # the first bound at or above it
        self._add(off + fmt.BUCKETS_AT + bucket * fmt.Q.size)
        fmt.Q.pack_into(self._mm, off + fmt.DELAY_SUM_AT, delay_sum_us)

    def _shifts(self, slot: int) -> tuple[float, float, float, float]:
        """The entry's last two grants: (original start, how much later it ends) each."""
        a, b, c, d = fmt.SHIFTS.unpack_from(self._mm, self._offset(slot) + fmt.SHIFTS_AT)
        return a, b, c, d

    def _set_shifts(self, slot: int, shifts: tuple[float, float, float, float]) -> None:
        fmt.SHIFTS.pack_into(self._mm, self._offset(slot) + fmt.SHIFTS_AT, *shifts)

    def _add_preempted(self, slot: int) -> None:
        self._add(self._offset(slot) + fmt.PREEMPTED_AT)

    def _add(self, at: int) -> None:
        fmt.Q.pack_into(self._mm, at, fmt.Q.unpack_from(self._mm, at)[0] + 1)

    def _rows(self, slot: int, now: float) -> tuple[list[scheduling.Row], Mine | None]:
        """``ledger_format.rows`` of the entries in use (file locked); the liveness scan is the
        caller's (``scan_due``, ``_live_entries``)."""
        return fmt.rows(self._mm, self._used(), slot, now)

    def scan_due(self) -> bool:
        """Whether the next ``_live_entries(force=False)`` scans ``/proc`` for dead aclservers."""
        return self._clock() - self._last_liveness >= _LIVENESS_EVERY_S

    def _live_entries(self, *, force: bool) -> list[LedgerEntry]:
        entries = [e for e in (self._decode(i) for i in self._used()) if e is not None]
        now = self._clock()
        if not force and now - self._last_liveness < _LIVENESS_EVERY_S:
            return entries
        self._last_liveness = now
        live = []
        for e in entries:
            if _alive(e.pid, e.starttime):
                live.append(e)
            else:
                self._mm[self._offset(e.slot)] = 0
        return live


class _Lock:
    """Thread lock + flock on the ledger file, as one context manager; ``held`` runs once both are held."""

    def __init__(self, tlock: threading.Lock, fd: int, held: Callable[[], None]) -> None:
        self._tlock = tlock
        self._fd = fd
        self._held = held

    def __enter__(self) -> None:
        self._tlock.acquire()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._tlock.release()
            raise
        try:
            self._held()
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._tlock.release()


def _v1_has_live_entries(fd: int, head: bytes, size: int) -> bool:
    """Whether a version-1 ledger file still has an entry of a live aclserver."""
    (slots,) = fmt.COUNT.unpack_from(head, fmt.SLOTS_OFFSET)
    (capacity,) = fmt.COUNT.unpack_from(head, fmt.CAPACITY_OFFSET)
    count = min(
        max(capacity, slots or fmt.MAX_ENTRIES), max(0, size - fmt.V1_HEADER_SIZE) // fmt.V1_ENTRY.size
    )
    raw = os.pread(fd, count * fmt.V1_ENTRY.size, fmt.V1_HEADER_SIZE)
    for i in range(len(raw) // fmt.V1_ENTRY.size):
        f = fmt.V1_ENTRY.unpack_from(raw, i * fmt.V1_ENTRY.size)
        if f[0] and _alive(f[4], f[7]):
            return True
    return False


def _proc_stat(pid: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[19])


def starttime(pid: int) -> int:
    stat = _proc_stat(pid)
    return stat[1] if stat else 0


def _alive(pid: int, starttime: int) -> bool:
    """A pid counts as alive if it exists, is not a zombie and started when the entry says."""
    stat = _proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return starttime == 0 or stat[1] == starttime
