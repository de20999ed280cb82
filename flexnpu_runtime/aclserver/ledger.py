"""The per-die compute ledger: one mmap'ed file per die, shared by every aclserver on that die.

Owns the file format, locking (``flock`` on the file plus a thread lock), registration with the
same-policy rule and the per-die aclserver limit, liveness (entries of dead or zombie pids are
dropped, so a SIGKILL'd server's reservation disappears) and the blocking ``acquire`` loop around
``scheduling.decide``. The ledger never trusts a client: only aclservers write it, with time they
measured themselves.

File ``<ledger_dir>/die-<phy>.ledger``: a header (magic, version, die, busy_until, busy_slot,
slots, capacity; since version 2 last_start, lc_until and the two open grants) then ``capacity``
fixed-size entries, one per vNPU an aclserver serves on the die (pid, process start time, claim,
share, quota, policy, memory_only, waiting flag, period use, consumed time, memory use, kernel
count; since version 2 also priority, slices preempted, the queueing-delay histogram and how far
its last two grants moved).

**Version 2** (priorities) has larger entries. A version-1 file is rewritten as version 2 when none
of its aclservers lives any more; while one does, a new aclserver on that die is refused with a
StateError naming the file (restart the old claim's aclserver, or wait for it to go).

**Priority** (``scheduling.py``): a latency-critical share may take the die at the next
``YIELD_US`` boundary of a splittable grant; every splittable grant reaching past that point ends
later by the inserted slice, recorded in its entry (``shifts``: original start, delay; the last
two grants), and its holder asks ``confirm`` at the end it knows where the end went. Priorities may mix on a die
(they change when, not how much); policies may not (the one-policy rule below).

**One aclserver = one slot.** ``slots`` is the die's limit of aclservers (the configured
``max_shares_per_die``, 63 by default, of the aclserver that created the file): the per-die
process limit of the device counts processes, and one aclserver serves all of a claim's vNPUs
(``vnpus: N``) and sessions, so registration refuses a share only when the die already has
``slots`` other live aclservers; it is the same number, counted the same way, as the ``shares``
capacity the scheduler charges once per share device allocation (``dra_driver/slices.py``).
``capacity`` (entries) starts at ``slots`` and doubles when an aclserver's vNPUs need more, up to
``slots * MAX_VNPUS_PER_ACLSERVER``; an opener re-maps when it sees the file grew. A file written
before ``capacity`` existed reads 0 there and has ``slots`` entries (64 when ``slots`` reads 0 too,
the first format); a process of that release sees only the first ``slots`` entries.
"""

from __future__ import annotations

import bisect
import fcntl
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dra_driver.errors import ErrorCode, StateError, Unavailable
from flexnpu_runtime.aclserver import scheduling
from flexnpu_wire.codes import Policy, Priority
from flexnpu_wire.launch import DEFAULT_MAX_SHARES_PER_DIE

__all__ = [
    "DEFAULT_MAX_SHARES",
    "DELAY_BUCKETS_S",
    "MAX_ENTRIES",
    "MAX_VNPUS_PER_ACLSERVER",
    "DieLedger",
    "LedgerEntry",
    "Pause",
    "ledger_path",
    "read_entries",
]

MAGIC = b"FNPULDG1"
VERSION = 2
DEFAULT_MAX_SHARES = DEFAULT_MAX_SHARES_PER_DIE
MAX_ENTRIES = 64
"""Slots of a ledger file written before the header recorded its slot count."""
MAX_VNPUS_PER_ACLSERVER = 16
"""What the entries may grow to, per slot: ``vnpus: 16`` (``dra_driver/sharing.py`` MAX_VNPUS)."""
_HEADER = struct.Struct("<8sIIdi")
_COUNT = struct.Struct("<I")
_SLOTS_OFFSET = 28
_CAPACITY_OFFSET = 32
DELAY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
"""Upper bounds of the queueing-delay histogram's buckets (seconds); one more counts the rest."""
_V1_ENTRY = struct.Struct("<BBBBiiiQ48sqqqdQQQd")
_ENTRY = struct.Struct(f"<BBBBiiiQ48sqqqdQQQdB7xQQdddd{len(DELAY_BUCKETS_S) + 1}Q")
_WAITING_AT = 3
_PERIOD = struct.Struct("<qqq")
"""period_idx, period_used_us, consumed_us: what a grant writes, with kernels and last_grant."""
_PERIOD_AT = struct.calcsize("<BBBBiiiQ48s")
_COUNTS = struct.Struct("<Qd")
_COUNTS_AT = struct.calcsize("<BBBBiiiQ48sqqqdQQ")
_PREEMPTED_AT = _V1_ENTRY.size + 8
_DELAY_SUM_AT = _PREEMPTED_AT + 8
_SHIFTS = struct.Struct("<dddd")
_SHIFTS_AT = _DELAY_SUM_AT + 8
_BUCKETS_AT = _SHIFTS_AT + _SHIFTS.size
_Q = struct.Struct("<Q")
_D = struct.Struct("<d")
_LAST_START_AT = 40
_LC_UNTIL_AT = 48
_OPEN = struct.Struct("<iB3xddd")
"""An open grant: slot (-1: none), splittable, original start, start, end."""
_OPENS_AT = 56
_HEADER_SIZE = 128
_V1_HEADER_SIZE = 64


def _file_size(slots: int) -> int:
    return _HEADER_SIZE + slots * _ENTRY.size


_LIVENESS_EVERY_S = 0.2
_MAX_SHIFTABLE = 1024
"""Splittable grants remembered for ``confirm`` before the long-ended ones are forgotten."""


class Pause(Protocol):
    """How a thread waiting for the die waits: ``wait(timeout)`` returns True once cancelled.
    A ``threading.Event``; the aclserver's session thread also serves its connection meanwhile."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One decoded ledger entry (what ``flexnpu-smi``, tests and benchmarks read)."""

    slot: int
    pid: int
    starttime: int
    claim_uid: str
    virtual_id: int
    quota: int
    policy: Policy
    memory_only: bool
    waiting: bool
    waiting_since: float
    period_idx: int
    period_used_us: int
    consumed_us: int
    mem_used: int
    mem_quota: int
    kernels: int
    last_grant: float
    priority: Priority = Priority.NORMAL
    preempted: int = 0
    """Slices this share had booked that a latency-critical share took the die ahead of."""
    delay_sum_us: int = 0
    """Queueing delay of its tasks so far (their first slice's wait for the die), summed."""
    delay_buckets: tuple[int, ...] = ()
    """Tasks per queueing-delay bucket (``DELAY_BUCKETS_S``, then the rest): not cumulative."""
    shifts: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0)
    """Its last two grants: (original start, how much later it ends) each."""

    def row(self, *, waiting_since: float | None = None) -> scheduling.Row:
        """As the scheduler sees it; ``waiting_since``: as waiting since then (one that asks now)."""
        waiting = self.waiting or waiting_since is not None
        since = self.waiting_since if self.waiting or waiting_since is None else waiting_since
        return scheduling.Row(
            self.slot, self.quota, self.policy, self.memory_only, waiting, since, self.period_idx,
            self.period_used_us, self.last_grant, self.priority,
        )  # fmt: skip


def ledger_path(ledger_dir: str, die_phy_id: int) -> str:
    return os.path.join(ledger_dir, f"die-{die_phy_id}.ledger")


def read_entries(ledger_dir: str, die_phy_id: int, *, check_liveness: bool = True) -> list[LedgerEntry]:
    """Live entries of a die's ledger (empty if the file does not exist).

    Without ``check_liveness`` the entries are only decoded (no /proc lookups, nothing written):
    for an observer that knows by other means which aclservers live (the daemon's usage report).
    """
    path = ledger_path(ledger_dir, die_phy_id)
    if not os.path.exists(path):
        return []
    ledger = DieLedger(ledger_dir, die_phy_id, create=False)
    try:
        return ledger.entries() if check_liveness else ledger.snapshot()
    finally:
        ledger.close()


class DieLedger:
    """An open die ledger. One instance per die per process; thread-safe."""

    slots: int  # the die's aclserver limit, as the file records it
    capacity: int  # entries the file holds now

    def __init__(
        self, ledger_dir: str, die_phy_id: int, *, max_shares: int = DEFAULT_MAX_SHARES, create: bool = True
    ) -> None:
        self.die = die_phy_id
        self.path = ledger_path(ledger_dir, die_phy_id)
        self.max_shares = max_shares
        if create:
            Path(ledger_dir).mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_CREAT if create else 0)
        self._fd = os.open(self.path, flags, 0o600)
        self._tlock = threading.Lock()
        self._last_liveness = 0.0
        self._shiftable: set[tuple[int, float]] = set()
        """Grants this process holds that may still end later (splittable): (slot, start)."""
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
        head = os.pread(self._fd, _HEADER_SIZE, 0) if size >= _HEADER_SIZE else b""
        if len(head) == _HEADER_SIZE and head[:8] == MAGIC:
            (_magic, version, _die, _busy, _slot) = _HEADER.unpack_from(head, 0)
            if version == VERSION:
                self._map_existing(head, size)
                return
            # a file of the release before priorities may start afresh once none of its aclservers lives
            if version != 1 or not create or _v1_has_live_entries(self._fd, head, size):
                raise StateError(
                    f"ledger {self.path} has version {version}, expected {VERSION}"
                    + (
                        ": an aclserver of the previous release still runs on this die"
                        if version == 1
                        else ""
                    )
                )
        self._create_mapping(max_shares)

    def _map_existing(self, head: bytes, size: int) -> None:
        (slots,) = _COUNT.unpack_from(head, _SLOTS_OFFSET)
        (capacity,) = _COUNT.unpack_from(head, _CAPACITY_OFFSET)
        self.slots = slots or MAX_ENTRIES
        self.capacity = max(capacity, self.slots)
        if size < _file_size(self.capacity):
            os.ftruncate(self._fd, _file_size(self.capacity))
        self._mm = mmap.mmap(self._fd, _file_size(self.capacity))

    def _create_mapping(self, max_shares: int) -> None:
        self.slots = self.capacity = max_shares
        os.ftruncate(self._fd, 0)
        os.ftruncate(self._fd, _file_size(self.capacity))
        self._mm = mmap.mmap(self._fd, _file_size(self.capacity))
        self._mm[: _file_size(self.capacity)] = bytes(_file_size(self.capacity))
        _HEADER.pack_into(self._mm, 0, MAGIC, VERSION, self.die, 0.0, -1)
        for i in range(2):
            _OPEN.pack_into(self._mm, _OPENS_AT + i * _OPEN.size, -1, 0, 0.0, 0.0, 0.0)
        _COUNT.pack_into(self._mm, _SLOTS_OFFSET, self.slots)
        _COUNT.pack_into(self._mm, _CAPACITY_OFFSET, self.capacity)

    def _follow_growth(self) -> None:
        """Map the whole file again when another opener grew it (called with the file locked)."""
        (capacity,) = _COUNT.unpack_from(self._mm, _CAPACITY_OFFSET)
        if capacity > self.capacity:
            self._mm.close()
            self.capacity = capacity
            self._mm = mmap.mmap(self._fd, _file_size(capacity))

    def _grow(self, claim_uid: str) -> int:
        """Double the entries (file locked); the first new entry, or Unavailable at the ceiling."""
        ceiling = self.slots * MAX_VNPUS_PER_ACLSERVER
        if self.capacity >= ceiling:
            raise Unavailable(
                f"die {self.die}'s ledger holds {self.capacity} vNPUs, the most its {self.slots} aclservers"
                f" may serve ({MAX_VNPUS_PER_ACLSERVER} each)",
                claim_uid=claim_uid,
                field="vnpus",
            )
        first, capacity = self.capacity, min(ceiling, self.capacity * 2)
        os.ftruncate(self._fd, _file_size(capacity))  # new entries read as zero: free
        self._mm.close()
        self._mm = mmap.mmap(self._fd, _file_size(capacity))
        self.capacity = capacity
        _COUNT.pack_into(self._mm, _CAPACITY_OFFSET, capacity)
        return first

    # -- registration -------------------------------------------------------------------------

    def register(
        self,
        *,
        claim_uid: str,
        virtual_id: int,
        quota: int,
        policy: Policy,
        memory_only: bool,
        mem_quota: int,
        pid: int | None = None,
        priority: Priority = Priority.NORMAL,
    ) -> int:
        """Add an entry for one vNPU of aclserver ``pid`` and return it; refuse a policy other shares
        don't use, and a new aclserver on a die that serves ``slots`` already."""
        pid = os.getpid() if pid is None else pid
        starttime = _starttime(pid)
        with self._locked():
            entries = self._live_entries(force=True)
            if not memory_only:
                others = {e.policy for e in entries if not e.memory_only}
                if others and policy not in others:
                    raise StateError(
                        f"die {self.die} already runs shares with policy {', '.join(sorted(others))};"
                        f" all shares of a die must use one policy, this share asks for {policy}",
                        code=ErrorCode.POLICY_CONFLICT,
                        claim_uid=claim_uid,
                        field="policy",
                    )
            servers = {(e.pid, e.starttime) for e in entries}
            limit = min(self.slots, self.max_shares)
            if (pid, starttime) not in servers and len(servers) >= limit:
                raise Unavailable(
                    f"die {self.die} already serves {len(servers)} aclservers, its limit"
                    f" (max_shares_per_die {limit}; one aclserver however many vNPUs and sessions it serves)",
                    claim_uid=claim_uid,
                    field="max_shares_per_die",
                )
            used = {e.slot for e in entries}
            free = [i for i in range(self.capacity) if i not in used]
            slot = free[0] if free else self._grow(claim_uid)
            raw = _ENTRY.pack(
                1,
                policy.number,
                int(memory_only),
                0,
                pid,
                virtual_id,
                quota,
                starttime,
                claim_uid.encode()[:48],
                0,
                0,
                0,
                0.0,
                0,
                mem_quota,
                0,
                0.0,
                priority.number,
                0,
                0,
                0.0,
                0.0,
                0.0,
                0.0,
                *([0] * (len(DELAY_BUCKETS_S) + 1)),
            )
            self._mm[self._offset(slot) : self._offset(slot) + _ENTRY.size] = raw
            return slot

    def unregister(self, slot: int) -> None:
        with self._locked():
            self._mm[self._offset(slot)] = 0
            _magic, _v, _d, busy_until, busy_slot = _HEADER.unpack_from(self._mm, 0)
            if busy_slot == slot:
                _HEADER.pack_into(self._mm, 0, MAGIC, VERSION, self.die, busy_until, -1)

    # -- compute --------------------------------------------------------------------------------

    def acquire(
        self, slot: int, want_us: int, cancel: Pause, *, ready_at: float | None = None
    ) -> tuple[float, float] | None:
        """Block until the die grants ``slot`` a slice of at most ``want_us``; return (start, end).

        Returns None (and clears the waiting flag) when ``cancel`` is set first. ``ready_at``: the
        first slice of a task, ready to run since then; its wait for the die (start - ready_at) is
        counted in the queueing-delay histogram. A splittable grant may end later (a latency-critical
        slice went in): its holder asks ``confirm`` at the end it knows.
        """
        while True:
            if cancel.is_set():
                self._set_waiting(slot, False)
                return None
            with self._locked():
                entries = self._live_entries(force=False)
                mine = next((e for e in entries if e.slot == slot), None)
                if mine is None:
                    raise StateError(f"ledger entry {slot} of die {self.die} vanished")
                now = time.monotonic()
                # decided as waiting from now if not yet; written only if not granted at once
                rows = [e.row(waiting_since=now) if e.slot == slot else e.row() for e in entries]
                _m, _v, _d, busy_until, _bs = _HEADER.unpack_from(self._mm, 0)
                (last_start,) = _D.unpack_from(self._mm, _LAST_START_AT)
                (lc_until,) = _D.unpack_from(self._mm, _LC_UNTIL_AT)
                opens = self._opens()
                decision = scheduling.decide(
                    rows, slot, now=now, busy_until=busy_until, last_start=last_start, want_us=want_us,
                    opens=[g for _orig, g in opens], lc_until=lc_until,
                )  # fmt: skip
                if decision.granted:
                    return self._grant(mine, decision, now=now, ready_at=ready_at, opens=opens)
                if not mine.waiting:
                    self._write_fields(slot, waiting=True, waiting_since=now)
            delay = decision.retry_at - time.monotonic()
            if delay > 0:
                cancel.wait(min(delay, 0.05))

    def _opens(self) -> list[tuple[float, scheduling.Open]]:
        """The die's open grants (file locked), each with its original start."""
        out = []
        for i in range(2):
            slot, split, orig, start, end = _OPEN.unpack_from(self._mm, _OPENS_AT + i * _OPEN.size)
            if slot >= 0:
                out.append((orig, scheduling.Open(slot, start, end, bool(split))))
        return out

    def _grant(
        self,
        mine: LedgerEntry,
        decision: scheduling.Decision,
        *,
        now: float,
        ready_at: float | None,
        opens: list[tuple[float, scheduling.Open]],
    ) -> tuple[float, float]:
        """Write a grant (file locked): the share's period use, counts and delay, and the die's header."""
        slot, slice_us, start = mine.slot, decision.slice_us, decision.start
        end = start + slice_us / 1e6
        off = self._offset(slot)  # only the fields a grant changes
        self._mm[off + _WAITING_AT] = 0
        _PERIOD.pack_into(
            self._mm, off + _PERIOD_AT, decision.period_idx,
            decision.used_before_us + slice_us, mine.consumed_us + slice_us,
        )  # fmt: skip
        _COUNTS.pack_into(self._mm, off + _COUNTS_AT, mine.kernels + 1, now)
        if ready_at is not None:
            waited = max(0.0, start - ready_at)
            bucket = bisect.bisect_left(DELAY_BUCKETS_S, waited)  # the first bound at or above it
            at = off + _BUCKETS_AT + bucket * _Q.size
            _Q.pack_into(self._mm, at, _Q.unpack_from(self._mm, at)[0] + 1)
            _Q.pack_into(self._mm, off + _DELAY_SUM_AT, mine.delay_sum_us + round(waited * 1e6))
        if decision.insert:
            self._insert(start, slice_us / 1e6, opens)
            return start, end
        if decision.splittable:
            if len(self._shiftable) >= _MAX_SHIFTABLE:  # holders that never confirmed: long ended
                self._shiftable = {k for k in self._shiftable if k[1] > now - 1.0}
            self._shiftable.add((slot, start))
            a_orig, _a, b_orig, _b = _SHIFTS.unpack_from(self._mm, off + _SHIFTS_AT)
            ring = off + _SHIFTS_AT + (0 if a_orig <= b_orig else 16)  # replace the older of the two
            _D.pack_into(self._mm, ring, start)
            _D.pack_into(self._mm, ring + 8, 0.0)
        last = opens[-1] if opens else None
        kept = [last] if last is not None else []
        for i, (orig, g) in enumerate(
            [*kept, (start, scheduling.Open(slot, start, end, decision.splittable))]
        ):
            _OPEN.pack_into(
                self._mm, _OPENS_AT + i * _OPEN.size, g.slot, int(g.splittable), orig, g.start, g.end
            )
        _HEADER.pack_into(self._mm, 0, MAGIC, VERSION, self.die, end, slot)
        _D.pack_into(self._mm, _LAST_START_AT, start)
        return start, end

    def _insert(self, at: float, length: float, opens: list[tuple[float, scheduling.Open]]) -> None:
        """A prioritized slice goes in at ``at``: every splittable open grant reaching past it ends
        ``length`` later (and starts later, if it had not started by ``at``); file locked."""
        _m, _v, _d, busy_until, busy_slot = _HEADER.unpack_from(self._mm, 0)
        for i, (orig, g) in enumerate(opens):
            if not g.splittable or g.end <= at:
                continue
            start = g.start + length if g.start >= at else g.start
            _OPEN.pack_into(self._mm, _OPENS_AT + i * _OPEN.size, g.slot, 1, orig, start, g.end + length)
            off = self._offset(g.slot)
            if not self._mm[off]:
                continue
            shifts = list(_SHIFTS.unpack_from(self._mm, off + _SHIFTS_AT))
            for j in (0, 2):
                if shifts[j] == orig:
                    shifts[j + 1] += length
            _SHIFTS.pack_into(self._mm, off + _SHIFTS_AT, *shifts)
            _Q.pack_into(self._mm, off + _PREEMPTED_AT, _Q.unpack_from(self._mm, off + _PREEMPTED_AT)[0] + 1)
        _HEADER.pack_into(self._mm, 0, MAGIC, VERSION, self.die, max(busy_until, at) + length, busy_slot)
        (last_start,) = _D.unpack_from(self._mm, _LAST_START_AT)
        if last_start >= at:
            _D.pack_into(self._mm, _LAST_START_AT, last_start + length)
        _D.pack_into(self._mm, _LC_UNTIL_AT, at + length)

    def confirm(self, slot: int, grant: tuple[float, float]) -> tuple[float, float] | None:
        """Where a grant of ``slot`` is now, if a latency-critical slice went in before its end (None:
        it ends as granted, or as last confirmed). Ask at the end it knows, with the grant as
        ``acquire`` returned it; once it has ended, it is forgotten."""
        if (slot, grant[0]) not in self._shiftable:
            return None  # not splittable: nothing goes in before its end
        off = self._offset(slot)
        with self._locked():
            shifts = _SHIFTS.unpack_from(self._mm, off + _SHIFTS_AT) if self._mm[off] else ()
            now = time.monotonic()  # nothing goes in before this any more
        delay = next((shifts[j + 1] for j in (0, 2) if shifts and shifts[j] == grant[0]), 0.0)
        if grant[1] + delay <= now:
            self._shiftable.discard((slot, grant[0]))
        return (grant[0], grant[1] + delay) if delay else None

    def settle(self, slot: int, grant: tuple[float, float], until: float) -> int:
        """A grant of ``slot`` ended at ``until``, not at its end (an emulated operator computes on the
        host while it holds the die, and numpy cannot be cut off at a slice's end): the time it ran
        over is charged to the share's period (carried as debt, as every overrun is), the time it left
        unused is given back (within the grant's period) and the die frees then. Returns the
        microseconds charged (negative: given back)."""
        start, end = grant
        delta = round((max(until, start) - end) * 1e6)
        if not delta:
            return 0
        with self._locked():
            entry = self._decode(slot)
            if entry is None:
                return 0
            pidx = scheduling.period_of(time.monotonic())
            if delta < 0 and not entry.period_idx == pidx == scheduling.period_of(start):
                return 0  # that period's use is behind: nothing to give back from
            used = max(0, scheduling.effective_used(entry.row(), pidx) + delta)
            _PERIOD.pack_into(  # only the fields a settle changes, as a grant writes them
                self._mm, self._offset(slot) + _PERIOD_AT, max(pidx, entry.period_idx), used,
                max(0, entry.consumed_us + delta),
            )  # fmt: skip
            _m, _v, _d, busy_until, busy_slot = _HEADER.unpack_from(self._mm, 0)
            if busy_slot == slot and busy_until == end:  # the die's last grant: it frees at ``until``
                _HEADER.pack_into(self._mm, 0, MAGIC, VERSION, self.die, max(until, start), slot)
            for i, (orig, g) in enumerate(self._opens()):
                if g.slot == slot and g.end == end:
                    _OPEN.pack_into(self._mm, _OPENS_AT + i * _OPEN.size, g.slot, int(g.splittable), orig,
                                    g.start, max(until, start))  # fmt: skip
        return delta

    def set_mem_used(self, slot: int, used: int) -> None:
        with self._locked():
            self._write_fields(slot, mem_used=used)

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
        flags = self._mm[_HEADER_SIZE : _HEADER_SIZE + self.capacity * _ENTRY.size : _ENTRY.size]
        return [i for i, flag in enumerate(flags) if flag]

    @staticmethod
    def _offset(slot: int) -> int:
        return _HEADER_SIZE + slot * _ENTRY.size

    def _decode(self, slot: int) -> LedgerEntry | None:
        f = _ENTRY.unpack_from(self._mm, self._offset(slot))
        if not f[0]:
            return None
        return LedgerEntry(
            slot=slot,
            policy=Policy.from_number(f[1]),
            memory_only=bool(f[2]),
            waiting=bool(f[3]),
            pid=f[4],
            virtual_id=f[5],
            quota=f[6],
            starttime=f[7],
            claim_uid=f[8].rstrip(b"\0").decode(errors="replace"),
            period_idx=f[9],
            period_used_us=f[10],
            consumed_us=f[11],
            waiting_since=f[12],
            mem_used=f[13],
            mem_quota=f[14],
            kernels=f[15],
            last_grant=f[16],
            priority=Priority.from_number(f[17]),
            preempted=f[18],
            delay_sum_us=f[19],
            shifts=tuple(f[20:24]),
            delay_buckets=tuple(f[24:]),
        )

    def _write_fields(self, slot: int, **changes: object) -> None:
        entry = self._decode(slot)
        if entry is None:
            return
        values = {name: getattr(entry, name) for name in LedgerEntry.__slots__}
        values.update(changes)
        raw = _ENTRY.pack(
            1,
            Policy(values["policy"]).number,
            int(bool(values["memory_only"])),
            int(bool(values["waiting"])),
            values["pid"],
            values["virtual_id"],
            values["quota"],
            values["starttime"],
            str(values["claim_uid"]).encode()[:48],
            values["period_idx"],
            values["period_used_us"],
            values["consumed_us"],
            values["waiting_since"],
            values["mem_used"],
            values["mem_quota"],
            values["kernels"],
            values["last_grant"],
            Priority(values["priority"]).number,
            values["preempted"],
            values["delay_sum_us"],
            *values["shifts"],
            *values["delay_buckets"],
        )
        off = self._offset(slot)
        self._mm[off : off + _ENTRY.size] = raw

    def _live_entries(self, *, force: bool) -> list[LedgerEntry]:
        entries = [e for e in (self._decode(i) for i in self._used()) if e is not None]
        now = time.monotonic()
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
    (slots,) = _COUNT.unpack_from(head, _SLOTS_OFFSET)
    (capacity,) = _COUNT.unpack_from(head, _CAPACITY_OFFSET)
    count = min(max(capacity, slots or MAX_ENTRIES), max(0, size - _V1_HEADER_SIZE) // _V1_ENTRY.size)
    raw = os.pread(fd, count * _V1_ENTRY.size, _V1_HEADER_SIZE)
    for i in range(len(raw) // _V1_ENTRY.size):
        f = _V1_ENTRY.unpack_from(raw, i * _V1_ENTRY.size)
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


def _starttime(pid: int) -> int:
    stat = _proc_stat(pid)
    return stat[1] if stat else 0


def _alive(pid: int, starttime: int) -> bool:
    """A pid counts as alive if it exists, is not a zombie and started when the entry says."""
    stat = _proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return starttime == 0 or stat[1] == starttime
