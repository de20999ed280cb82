"""The die ledger file's bytes: the header, the die's two open grants and the fixed-size entries (pure).

``ledger_file.LedgerFile`` owns the file (opening, mapping, locking, growth, the liveness of the
entries' aclservers); this module owns what its bytes mean: the layout (offsets and structs of the
header, an open grant and an entry, the version-1 entry a release before priorities wrote), the
decoded :class:`LedgerEntry`, and the codec between them — :func:`decode` and :func:`encode` of a
whole entry, :func:`rows` (only what the scheduler reads of each entry in use), :func:`init_header`
(a fresh file). Nothing here opens, locks or maps a file: every function takes the mapped buffer.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from flexnpu_runtime.aclserver import scheduling
from flexnpu_wire.codes import Policy, Priority

__all__ = [
    "DELAY_BUCKETS_S",
    "MAGIC",
    "MAX_ENTRIES",
    "MAX_VNPUS_PER_ACLSERVER",
    "VERSION",
    "LedgerEntry",
    "Mine",
    "OpenGrant",
    "decode",
    "encode",
    "file_size",
    "init_header",
    "offset",
    "rows",
]

MAGIC = b"FNPULDG1"
VERSION = 2
MAX_ENTRIES = 64
"""Slots of a ledger file written before the header recorded its slot count."""
MAX_VNPUS_PER_ACLSERVER = 16
"""What the entries may grow to, per slot: ``vnpus: 16`` (``dra_driver/sharing.py`` MAX_VNPUS)."""
HEADER = struct.Struct("<8sIIdi")
COUNT = struct.Struct("<I")
SLOTS_OFFSET = 28
CAPACITY_OFFSET = 32
DELAY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
"""Upper bounds of the queueing-delay histogram's buckets (seconds); one more counts the rest."""
V1_ENTRY = struct.Struct("<BBBBiiiQ48sqqqdQQQd")
ROW = struct.Struct("<BBBBiiiQ48sqqqdQQQdB")
"""The first fields of an entry, through its priority: what the scheduler reads of every entry."""
ENTRY = struct.Struct(f"{ROW.format}7xQQdddd{len(DELAY_BUCKETS_S) + 1}Q")
WAITING_AT = 3
PERIOD = struct.Struct("<qqq")
"""period_idx, period_used_us, consumed_us: what a grant writes, with kernels and last_grant."""
PERIOD_AT = struct.calcsize("<BBBBiiiQ48s")
COUNTS = struct.Struct("<Qd")
COUNTS_AT = struct.calcsize("<BBBBiiiQ48sqqqdQQ")
PREEMPTED_AT = V1_ENTRY.size + 8
DELAY_SUM_AT = PREEMPTED_AT + 8
SHIFTS = struct.Struct("<dddd")
SHIFTS_AT = DELAY_SUM_AT + 8
BUCKETS_AT = SHIFTS_AT + SHIFTS.size
Q = struct.Struct("<Q")
D = struct.Struct("<d")
LAST_START_AT = 40
LC_UNTIL_AT = 48
OPEN = struct.Struct("<iB3xddd")
"""An open grant: slot (-1: none), splittable, original start, start, end."""
OPENS_AT = 56
HEADER_SIZE = 128
V1_HEADER_SIZE = 64


def file_size(slots: int) -> int:
    return HEADER_SIZE + slots * ENTRY.size


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


def offset(slot: int) -> int:
    """Where entry ``slot`` starts in the file."""
    return HEADER_SIZE + slot * ENTRY.size


def init_header(buf: Any, die: int, slots: int) -> None:
    """A fresh file's header in ``buf`` (already zeroed): no grant, no open grant, ``slots`` entries."""
    HEADER.pack_into(buf, 0, MAGIC, VERSION, die, 0.0, -1)
    for i in range(2):
        OPEN.pack_into(buf, OPENS_AT + i * OPEN.size, -1, 0, 0.0, 0.0, 0.0)
    COUNT.pack_into(buf, SLOTS_OFFSET, slots)
    COUNT.pack_into(buf, CAPACITY_OFFSET, slots)


def decode(buf: Any, slot: int) -> LedgerEntry | None:
    """Entry ``slot`` of ``buf``, or None when it is free."""
    f = ENTRY.unpack_from(buf, offset(slot))
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


def encode(e: LedgerEntry) -> bytes:
    """All of ``e`` as its slot holds it (flagged in use)."""
    return ENTRY.pack(
        1, e.policy.number, int(e.memory_only), int(e.waiting), e.pid, e.virtual_id, e.quota, e.starttime,
        e.claim_uid.encode()[:48], e.period_idx, e.period_used_us, e.consumed_us, e.waiting_since,
        e.mem_used, e.mem_quota, e.kernels, e.last_grant, e.priority.number, e.preempted, e.delay_sum_us,
        *e.shifts, *e.delay_buckets,
    )  # fmt: skip


def rows(buf: Any, used: Sequence[int], slot: int, now: float) -> tuple[list[scheduling.Row], Mine | None]:
    """The scheduler's rows of the entries ``used``, ``slot``'s as asking since ``now`` if not
    waiting yet, and what a grant needs of ``slot``'s entry (None: not in use).

    Only the fields the scheduler reads are decoded (``LedgerEntry.row`` of each entry, without
    making the entries)."""
    out, mine = [], None
    for i in used:
        off = HEADER_SIZE + i * ENTRY.size
        f = ROW.unpack_from(buf, off)
        waiting, since = bool(f[3]), f[12]
        if i == slot:
            (delay_sum,) = Q.unpack_from(buf, off + DELAY_SUM_AT)
            mine = Mine(i, waiting, f[11], f[15], delay_sum)
            if not waiting:
                waiting, since = True, now
        out.append(
            scheduling.Row(
                i, f[6], _policy_of(f[1]), bool(f[2]), waiting, since, f[9], f[10], f[16], _priority_of(f[17])
            )
        )
    return out, mine


_POLICIES: dict[int, Policy] = {}
_PRIORITIES: dict[int, Priority] = {}


def _policy_of(number: int) -> Policy:
    policy = _POLICIES.get(number)
    if policy is None:  # ValueError for a number no release wrote, as LedgerEntry's decode
        policy = _POLICIES[number] = Policy.from_number(number)
    return policy


def _priority_of(number: int) -> Priority:
    priority = _PRIORITIES.get(number)
    if priority is None:
        priority = _PRIORITIES[number] = Priority.from_number(number)
    return priority
