"""The per-die ledger file: registration, the one-policy rule, liveness of pids, grants."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.errors import ErrorCode, StateError, Unavailable
from flexnpu_runtime.aclserver import ledger, ledger_file, ledger_format
from flexnpu_testing.aclserver_harness import wait_for
from flexnpu_wire.codes import Policy


@pytest.fixture
def die(tmp_path: Path) -> Iterator[ledger.DieLedger]:
    d = ledger.DieLedger(str(tmp_path), 7)
    yield d
    d.close()


def reg(
    d: ledger.DieLedger, policy: Policy, *, quota: int = 10, memory_only: bool = False, pid: int | None = None
) -> int:
    return d.register(
        claim_uid="c",
        virtual_id=0,
        quota=quota,
        policy=policy,
        memory_only=memory_only,
        mem_quota=1 << 20,
        pid=pid,
    )


@pytest.mark.parametrize(
    ("second", "memory_only", "ok"),
    [
        pytest.param(Policy.FIXED, False, True, id="same"),
        pytest.param(Policy.ELASTIC, False, False, id="elastic-vs-fixed"),
        pytest.param(Policy.BEST_EFFORT, False, False, id="best-effort-vs-fixed"),
        pytest.param(Policy.BEST_EFFORT, True, True, id="memory-only-exempt"),
    ],
)
def test_one_policy_per_die(die: ledger.DieLedger, second: Policy, memory_only: bool, ok: bool) -> None:
    reg(die, Policy.FIXED)
    if ok:
        reg(die, second, memory_only=memory_only)
        assert len(die.entries()) == 2
    else:
        with pytest.raises(StateError) as err:
            reg(die, second, memory_only=memory_only)
        assert err.value.code == ErrorCode.POLICY_CONFLICT and err.value.field == "policy"
        assert len(die.entries()) == 1


def test_entries_are_shared_between_openers(tmp_path: Path, die: ledger.DieLedger) -> None:
    slot = reg(die, Policy.ELASTIC, quota=40)
    (entry,) = ledger.read_entries(str(tmp_path), 7)
    assert (entry.slot, entry.pid, entry.quota, entry.policy) == (slot, os.getpid(), 40, Policy.ELASTIC)
    die.unregister(slot)
    assert ledger.read_entries(str(tmp_path), 7) == []


def test_dead_and_zombie_pids_are_dropped(die: ledger.DieLedger) -> None:
    reaped = subprocess.Popen(["true"])
    reaped.wait()
    zombie = subprocess.Popen(["true"])
    try:
        wait_for(
            lambda: Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z",
            what="zombie",
        )
        reg(die, Policy.FIXED, pid=reaped.pid)
        reg(die, Policy.FIXED, pid=zombie.pid)
        # both gone: a conflicting policy is accepted because nobody alive holds the die
        reg(die, Policy.ELASTIC)
        assert [e.pid for e in die.entries()] == [os.getpid()]
    finally:
        zombie.wait()


def test_acquire_grants_and_accounts(die: ledger.DieLedger) -> None:
    import dataclasses
    import time

    from flexnpu_runtime.aclserver import scheduling

    slot = reg(die, Policy.BEST_EFFORT)
    (before,) = die.entries()
    asked = time.monotonic()
    start, end = die.acquire(slot, 2_000, threading.Event())  # type: ignore[misc]
    assert round((end - start) * 1e6) == 2_000
    (entry,) = die.entries()
    assert (entry.consumed_us, entry.kernels, entry.waiting) == (2_000, 1, False)
    assert (entry.period_idx, entry.period_used_us) == (scheduling.period_of(start), 2_000)
    assert asked <= entry.last_grant <= time.monotonic()
    die.acquire(slot, 1_000, threading.Event())
    (entry,) = die.entries()
    assert (entry.consumed_us, entry.kernels) == (3_000, 2)
    # the second waited for the first slice's end: it was flagged waiting (since then) meanwhile
    changed = {"consumed_us", "kernels", "period_idx", "period_used_us", "last_grant", "waiting_since"}
    same = [f.name for f in dataclasses.fields(entry) if f.name not in changed]
    assert [getattr(entry, n) for n in same] == [getattr(before, n) for n in same], (
        "a grant writes only its fields"
    )


def test_the_rows_a_grant_decides_on_are_the_entries_rows(die: ledger.DieLedger) -> None:
    """``acquire`` decodes only the scheduler's fields of each entry: the same rows as the whole
    entries give, the asking share's as waiting since now unless it waited already."""
    import time

    from flexnpu_wire.codes import Priority

    a = reg(die, Policy.ELASTIC, quota=30)
    b = die.register(
        claim_uid="d", virtual_id=1, quota=70, policy=Policy.ELASTIC, memory_only=False,
        mem_quota=1 << 20, priority=Priority.LATENCY_CRITICAL,
    )  # fmt: skip
    die.acquire(a, 1_000, threading.Event())
    die._write_fields(b, waiting=True, waiting_since=123.0, kernels=5, delay_sum_us=77)
    now = time.monotonic()
    with die._locked():
        for slot in (a, b):
            rows, mine = die._rows(slot, now)
            entries = {e.slot: e for e in die._live_entries(force=True)}
            assert rows == [e.row(waiting_since=now) if e.slot == slot else e.row() for e in entries.values()]
            e = entries[slot]
            assert mine == ledger_format.Mine(slot, e.waiting, e.consumed_us, e.kernels, e.delay_sum_us)
        assert [r.waiting_since for r in die._rows(a, now)[0]] == [now, 123.0]
        assert die._rows(99, now)[1] is None


def test_acquire_waits_over_budget_and_cancel_clears_waiting(die: ledger.DieLedger) -> None:
    import time

    from flexnpu_runtime.aclserver import scheduling

    slot = reg(die, Policy.FIXED, quota=1)
    # a debt of 10 s of die time: at 1 % this share may not run for a long while
    die._write_fields(slot, period_idx=scheduling.period_of(time.monotonic()), period_used_us=10_000_000)
    cancel = threading.Event()
    result: list[object] = []
    waiter = threading.Thread(target=lambda: result.append(die.acquire(slot, 1_000, cancel)))
    waiter.start()
    wait_for(lambda: die.entries()[0].waiting, what="share waiting")
    cancel.set()
    waiter.join(10)
    assert result == [None]
    assert die.entries()[0].waiting is False


@pytest.fixture
def aclservers() -> Iterator[list[int]]:
    """Pids of live processes standing in for aclservers (the limit counts processes)."""
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(4)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_share_limit_counts_aclservers_not_vnpus(tmp_path: Path, aclservers: list[int]) -> None:
    d = ledger.DieLedger(str(tmp_path), 3, max_shares=3)
    try:
        assert d.slots == 3
        for pid in aclservers[:3]:
            for _ in range(ledger.MAX_VNPUS_PER_ACLSERVER):  # vnpus: 16, one aclserver
                reg(d, Policy.FIXED, pid=pid)
        assert len(d.entries()) == 48 and d.capacity == 48  # the file grew as the vNPUs needed
        with pytest.raises(Unavailable) as err:
            reg(d, Policy.FIXED, pid=aclservers[3])  # a fourth aclserver: over the limit
        assert err.value.field == "max_shares_per_die" and "3 aclservers" in str(err.value)
        with pytest.raises(Unavailable) as err:
            reg(d, Policy.FIXED, pid=aclservers[0])  # a 17th vNPU of one aclserver: the ledger is full
        assert err.value.field == "vnpus"
    finally:
        d.close()
    # another aclserver opening the same die reads the limit and the entries from the file
    again = ledger.DieLedger(str(tmp_path), 3, max_shares=63)
    try:
        assert (again.slots, again.capacity, len(again.entries())) == (3, 48, 48)
    finally:
        again.close()


def test_an_opener_follows_a_file_another_one_grew(tmp_path: Path, aclservers: list[int]) -> None:
    first = ledger.DieLedger(str(tmp_path), 5, max_shares=2)
    second = ledger.DieLedger(str(tmp_path), 5, max_shares=2)
    try:
        slots = [reg(first, Policy.ELASTIC, pid=aclservers[0]) for _ in range(5)]
        assert slots == [0, 1, 2, 3, 4] and first.capacity == 8
        assert second.capacity == 2  # mapped before the file grew
        assert sorted(e.slot for e in second.entries()) == slots and second.capacity == 8
        assert reg(second, Policy.ELASTIC, pid=aclservers[1]) == 5
        assert len(first.entries()) == 6
    finally:
        first.close()
        second.close()


def test_default_limit_is_63_and_a_file_without_a_slot_count_has_64(tmp_path: Path) -> None:
    d = ledger.DieLedger(str(tmp_path), 4)
    try:
        assert d.slots == 63 == ledger.DEFAULT_MAX_SHARES
    finally:
        d.close()
    path = Path(ledger.ledger_path(str(tmp_path), 4))
    raw = bytearray(path.read_bytes())
    raw[28:32] = bytes(4)  # as written by the previous version: no slot count in the header
    path.write_bytes(bytes(raw) + bytes(ledger_format.ENTRY.size))  # and its 64th slot
    old = ledger.DieLedger(str(tmp_path), 4, max_shares=63)
    try:
        assert old.slots == ledger.MAX_ENTRIES == 64
        assert old.entries() == []
    finally:
        old.close()


class _Clock:
    """The ledger's now, set by the test: its decisions then depend on no machine's speed."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_latency_critical_slice_goes_in_and_the_holder_learns_its_later_end(
    tmp_path: Path, aclservers: list[int]
) -> None:
    from flexnpu_runtime.aclserver import scheduling
    from flexnpu_wire.codes import Priority

    clock = _Clock(1_000.0)
    die = ledger.DieLedger(str(tmp_path), 8, clock=clock)

    def register(pid: int, priority: Priority) -> int:
        return die.register(
            claim_uid="c", virtual_id=0, quota=50, policy=Policy.ELASTIC, memory_only=False, mem_quota=1 << 20,
            pid=pid, priority=priority,
        )  # fmt: skip

    try:
        batch = register(aclservers[0], Priority.BATCH)
        lc = register(aclservers[1], Priority.LATENCY_CRITICAL)
        held = die.acquire(batch, 5_000, threading.Event())
        assert held == (1_000.0, 1_000.005), "an idle die: granted now, whole"
        clock.now = asked = 1_000.00123  # the call comes 1.23 ms into the batch slice
        got = die.acquire(lc, 1_000, threading.Event(), ready_at=asked)
        assert got is not None and round((got[1] - got[0]) * 1e6) == 1_000
        assert got[0] == pytest.approx(1_000.00125), "at the batch slice's next 50 us boundary"
        assert (got[0] - held[0]) * 1e6 / scheduling.YIELD_US == pytest.approx(25)
        clock.now = 1_000.004  # the batch holder asks at the end it knows (or before it)
        assert die.confirm(batch, held) == pytest.approx((held[0], held[1] + 0.001))
        assert die.confirm(lc, got) is None, "a latency-critical slice is not split"
        clock.now = held[1]
        after = die.acquire(batch, 1_000, threading.Event())
        assert after is not None and after[0] == pytest.approx(held[1] + 0.001), (
            "not before the batch slice's new end"
        )
        entries = {e.slot: e for e in die.entries()}
        assert (entries[batch].priority, entries[batch].preempted) == (Priority.BATCH, 1)
        assert (entries[lc].priority, entries[lc].preempted) == (Priority.LATENCY_CRITICAL, 0)
        assert sum(entries[lc].delay_buckets) == 1 and sum(entries[batch].delay_buckets) == 0
        assert entries[lc].delay_buckets[0] == 1, "20 us of queueing: the first bucket (<= 100 us)"
        assert entries[lc].delay_sum_us == 20
    finally:
        die.close()


def _v1_file(tmp_path: Path, die_id: int, pid: int) -> Path:
    path = Path(ledger.ledger_path(str(tmp_path), die_id))
    head = bytearray(64)
    ledger_format.HEADER.pack_into(head, 0, ledger_format.MAGIC, 1, die_id, 0.0, -1)
    ledger_format.COUNT.pack_into(head, ledger_format.SLOTS_OFFSET, 4)
    ledger_format.COUNT.pack_into(head, ledger_format.CAPACITY_OFFSET, 4)
    entry = ledger_format.V1_ENTRY.pack(
        1, 2, 0, 0, pid, 0, 50, ledger_file.starttime(pid), b"old", 0, 0, 0, 0.0, 0, 1 << 20, 0, 0.0
    )
    path.write_bytes(bytes(head) + entry + bytes(3 * ledger_format.V1_ENTRY.size))
    return path


def test_a_file_of_the_release_before_priorities(tmp_path: Path, aclservers: list[int]) -> None:
    """Rewritten once none of its aclservers lives; refused, naming the file, while one does."""
    _v1_file(tmp_path, 5, aclservers[0])
    with pytest.raises(StateError, match="previous release still runs"):
        ledger.DieLedger(str(tmp_path), 5)
    gone = subprocess.Popen(["true"])
    gone.wait()
    _v1_file(tmp_path, 6, gone.pid)
    with pytest.raises(StateError):  # an observer does not rewrite it
        ledger.DieLedger(str(tmp_path), 6, create=False)
    fresh = ledger.DieLedger(str(tmp_path), 6)
    try:
        assert fresh.entries() == [] and reg(fresh, Policy.FIXED) == 0
    finally:
        fresh.close()


def test_settle_charges_an_overrun_and_gives_back_what_a_grant_left(die: ledger.DieLedger) -> None:
    """An emulated operator's slice ends when its compute does: past its end, the overrun is charged
    (consumed and the period's use); before it, the rest is given back and the die frees then, so the
    next grant starts there, not at the slice's end."""
    import time

    from flexnpu_runtime.aclserver import scheduling

    slot, other = reg(die, Policy.FIXED, quota=50), reg(die, Policy.FIXED, quota=50)
    start, end = die.acquire(slot, 3_000, threading.Event())  # type: ignore[misc]
    assert die.settle(slot, (start, end), end + 0.002) == 2_000
    (entry,) = [e for e in die.entries() if e.slot == slot]
    assert entry.consumed_us == 5_000
    if entry.period_idx == scheduling.period_of(start):
        assert entry.period_used_us == 5_000
    for _attempt in range(3):  # a give-back stays within the grant's period: retried if it straddled one
        before = next(e for e in die.entries() if e.slot == slot).consumed_us
        start, end = die.acquire(slot, 4_000, threading.Event())  # type: ignore[misc]
        until = max(start, time.monotonic())
        given = die.settle(slot, (start, end), until)
        if given:
            break
    assert given == round((until - end) * 1e6) < 0
    (entry,) = [e for e in die.entries() if e.slot == slot]
    assert entry.consumed_us == before + 4_000 + given
    nxt, _ = die.acquire(other, 1_000, threading.Event())  # type: ignore[misc]
    # freed: the next grant starts when it is asked for (not before ``until``); held: exactly at ``end``
    assert nxt != end and nxt >= until, "the die freed when the grant was settled, not at its end"
