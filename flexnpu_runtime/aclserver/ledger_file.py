"""The die ledger's file: its format, mapping, locking, entries and the liveness of their aclservers.

One mmap'ed file per die (``<ledger_dir>/die-<phy>.ledger``), shared by every aclserver on that die and
read by flexnpu-daemon, the node's metrics and ``flexnpu-smi``. ``LedgerFile`` owns the bytes: a header
(magic, version, die, busy_until, busy_slot, slots, capacity; since version 2 last_start, lc_until and the
die's two open grants) then ``capacity`` fixed-size entries, one per vNPU an aclserver serves on the die
(pid, process start time, claim, share, quota, policy, memory_only, waiting flag, period use, consumed
time, memory use, kernel count; since version 2 also priority, slices preempted, the queueing-delay
histogram and how far its last two grants moved). It locks the file (``flock`` plus a thread lock),
decodes and writes entries, grows the file, follows another opener's growth, and drops the entries of
dead or zombie pids (so a SIGKILL'd server's reservation disappears). What the entries *mean* for the
die's time — registration rules and grants — is ``ledger.DieLedger``'s, built on this class.

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
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from dra_driver.errors import StateError, Unavailable
from flexnpu_runtime.aclserver import scheduling
from flexnpu_wire.codes import Policy, Priority

__all__ = [
    "DELAY_BUCKETS_S",
    "MAGIC",
    "MAX_ENTRIES",
    "MAX_VNPUS_PER_ACLSERVER",
    "VERSION",
    "LedgerEntry",
    "LedgerFile",
    "OpenGrant",
    "ledger_path",
    "starttime",
]

MAGIC = b"FNPULDG1"
VERSION = 2
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
_ROW = struct.Struct("<BBBBiiiQ48sqqqdQQQdB")
"""The first fields of an entry, through its priority: what the scheduler reads of every entry."""
_ENTRY = struct.Struct(f"{_ROW.format}7xQQdddd{len(DELAY_BUCKETS_S) + 1}Q")
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


class Mine(NamedTuple):
    """What a grant needs of the asking share's own entry, besides its row."""

    slot: int
    waiting: bool
    consumed_us: int
    kernels: int
    delay_sum_us: int


class OpenGrant(NamedTuple):
    """One of the die's two open grants as the header holds it (slot -1: none)."""

    slot: int
    splittable: int
    orig: float
    """Where it started when granted (a prioritized slice may have moved it since)."""
    start: float
    end: float


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

    def _write_fields(self, slot: int, **changes: Any) -> None:
        entry = self._decode(slot)
        if entry is not None:
            self._write_entry(dataclasses.replace(entry, **changes))

    def _write_entry(self, e: LedgerEntry) -> None:
        """Write all of ``e`` into its slot (file locked); the slot is in use from then on."""
        raw = _ENTRY.pack(
            1, e.policy.number, int(e.memory_only), int(e.waiting), e.pid, e.virtual_id, e.quota, e.starttime,
            e.claim_uid.encode()[:48], e.period_idx, e.period_used_us, e.consumed_us, e.waiting_since,
            e.mem_used, e.mem_quota, e.kernels, e.last_grant, e.priority.number, e.preempted, e.delay_sum_us,
            *e.shifts, *e.delay_buckets,
        )  # fmt: skip
        off = self._offset(e.slot)
        self._mm[off : off + _ENTRY.size] = raw

    # -- the fields a grant reads and writes (file locked) ------------------------------------------

    def _die_state(self) -> tuple[float, int, float, float]:
        """busy_until, busy_slot, last_start, lc_until: the end and holder of the die's last grant,
        its start, and the end of the last inserted (prioritized) slice."""
        _magic, _v, _d, busy_until, busy_slot = _HEADER.unpack_from(self._mm, 0)
        (last_start,) = _D.unpack_from(self._mm, _LAST_START_AT)
        (lc_until,) = _D.unpack_from(self._mm, _LC_UNTIL_AT)
        return busy_until, busy_slot, last_start, lc_until

    def _set_die_state(
        self,
        *,
        busy_until: float,
        busy_slot: int,
        last_start: float | None = None,
        lc_until: float | None = None,
    ) -> None:
        _HEADER.pack_into(self._mm, 0, MAGIC, VERSION, self.die, busy_until, busy_slot)
        if last_start is not None:
            _D.pack_into(self._mm, _LAST_START_AT, last_start)
        if lc_until is not None:
            _D.pack_into(self._mm, _LC_UNTIL_AT, lc_until)

    def _open_grants(self) -> list[OpenGrant]:
        """The die's two open grants as written (slot -1: none)."""
        return [OpenGrant(*_OPEN.unpack_from(self._mm, _OPENS_AT + i * _OPEN.size)) for i in range(2)]

    def _write_open(self, i: int, g: OpenGrant) -> None:
        _OPEN.pack_into(
            self._mm, _OPENS_AT + i * _OPEN.size, g.slot, int(g.splittable), g.orig, g.start, g.end
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
        self._mm[off + _WAITING_AT] = 0
        self._write_period(slot, period_idx, period_used_us, consumed_us)
        _COUNTS.pack_into(self._mm, off + _COUNTS_AT, kernels, last_grant)

    def _write_period(self, slot: int, period_idx: int, period_used_us: int, consumed_us: int) -> None:
        """The entry's use of the die: in which period, how much of it, how much in all (only those)."""
        _PERIOD.pack_into(self._mm, self._offset(slot) + _PERIOD_AT, period_idx, period_used_us, consumed_us)

    def _count_delay(self, slot: int, waited: float, delay_sum_us: int) -> None:
        """One more task in the queueing-delay bucket of ``waited`` seconds; the new sum."""
        off = self._offset(slot)
        bucket = bisect.bisect_left(DELAY_BUCKETS_S, waited)  # the first bound at or above it
        self._add(off + _BUCKETS_AT + bucket * _Q.size)
        _Q.pack_into(self._mm, off + _DELAY_SUM_AT, delay_sum_us)

    def _shifts(self, slot: int) -> tuple[float, float, float, float]:
        """The entry's last two grants: (original start, how much later it ends) each."""
        a, b, c, d = _SHIFTS.unpack_from(self._mm, self._offset(slot) + _SHIFTS_AT)
        return a, b, c, d

    def _set_shifts(self, slot: int, shifts: tuple[float, float, float, float]) -> None:
        _SHIFTS.pack_into(self._mm, self._offset(slot) + _SHIFTS_AT, *shifts)

    def _add_preempted(self, slot: int) -> None:
        self._add(self._offset(slot) + _PREEMPTED_AT)

    def _add(self, at: int) -> None:
        _Q.pack_into(self._mm, at, _Q.unpack_from(self._mm, at)[0] + 1)

    def _rows(self, slot: int, now: float) -> tuple[list[scheduling.Row], Mine | None]:
        """The scheduler's rows of the entries in use, ``slot``'s as asking since ``now`` if not
        waiting yet, and what a grant needs of ``slot``'s entry (None: not in use); file locked.

        Only the fields the scheduler reads are decoded (``LedgerEntry.row`` of each entry, without
        making the entries); the liveness scan is the caller's (``scan_due``, ``_live_entries``)."""
        mm, rows, mine = self._mm, [], None
        for i in self._used():
            off = _HEADER_SIZE + i * _ENTRY.size
            f = _ROW.unpack_from(mm, off)
            waiting, since = bool(f[3]), f[12]
            if i == slot:
                (delay_sum,) = _Q.unpack_from(mm, off + _DELAY_SUM_AT)
                mine = Mine(i, waiting, f[11], f[15], delay_sum)
                if not waiting:
                    waiting, since = True, now
            rows.append(
                scheduling.Row(
                    i, f[6], _policy(f[1]), bool(f[2]), waiting, since, f[9], f[10], f[16], _priority(f[17])
                )
            )
        return rows, mine

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


_POLICIES: dict[int, Policy] = {}
_PRIORITIES: dict[int, Priority] = {}


def _policy(number: int) -> Policy:
    policy = _POLICIES.get(number)
    if policy is None:  # ValueError for a number no release wrote, as LedgerEntry's decode
        policy = _POLICIES[number] = Policy.from_number(number)
    return policy


def _priority(number: int) -> Priority:
    priority = _PRIORITIES.get(number)
    if priority is None:
        priority = _PRIORITIES[number] = Priority.from_number(number)
    return priority


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


def starttime(pid: int) -> int:
    stat = _proc_stat(pid)
    return stat[1] if stat else 0


def _alive(pid: int, starttime: int) -> bool:
    """A pid counts as alive if it exists, is not a zombie and started when the entry says."""
    stat = _proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return starttime == 0 or stat[1] == starttime
