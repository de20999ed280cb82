"""Priorities on one die, with real aclservers, a real die ledger and real clients (docs/latency.md).

A latency-critical share's synchronous model executions next to a batch share that saturates the
die with 5 ms kernels: the executions go in between the batch slices (the batch share's slices
preempted count grows), every execution's wait for the die is counted in the latency-critical
share's queueing-delay histogram, and its die time is exactly what it executed (priority changes
when, not how much). No timings are asserted: bench/bench_latency.py measures those.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flexnpu_client import Session
from flexnpu_runtime.aclserver import ledger
from flexnpu_testing import aclserver_harness
from flexnpu_testing.aclserver_harness import Tenant
from flexnpu_testing.waiting import wait_for
from flexnpu_wire import modelfile as mf
from flexnpu_wire.codes import Policy, Priority

CALLS = 40
COST_US = 1_000


def _model() -> bytes:
    t = mf.Tensor("x", 0, mf.FORMAT_ND, (4,))
    return mf.render(
        mf.ModelFile(
            inputs=(t,),
            outputs=(mf.Output(mf.Tensor("y", 0, mf.FORMAT_ND, (4,)), mf.Op.AFFINE, 0, 0, 2.0, 1.0),),
            cost_us=COST_US,
            work_bytes=4096,
        )
    )


def test_latency_critical_executions_go_in_between_batch_slices(tmp_path: Path) -> None:
    ledger_dir = str(tmp_path / "ledger")

    def share(priority: Priority) -> list[aclserver_harness.ShareSpec]:
        return [aclserver_harness.share(0, die=0, compute=50, policy=Policy.ELASTIC, priority=priority)]

    with (
        aclserver_harness.running_aclserver(tmp_path, shares=share(Priority.LATENCY_CRITICAL), ledger_dir=ledger_dir) as lc,
        aclserver_harness.running_aclserver(tmp_path, shares=share(Priority.BATCH), ledger_dir=ledger_dir) as batch,
    ):  # fmt: skip
        entries = {e.pid: e for e in ledger.read_entries(ledger_dir, 0)}
        assert entries[lc.proc.pid].priority is Priority.LATENCY_CRITICAL
        assert entries[batch.proc.pid].priority is Priority.BATCH
        tenant = Tenant(batch.conf(), kernel_us=5_000).start()
        try:
            wait_for(
                lambda: ledger.read_entries(ledger_dir, 0) and tenant.samples[-1][1] > 0,
                what="the batch tenant's first kernels",
            )
            with Session.open(lc.conf()) as session:
                session.init()
                session.set_device(0)
                mid = session.load_model(_model())
                x, y = session.malloc(16), session.malloc(16)
                session.memcpy(x, 16, np.arange(4, dtype="<f4").tobytes(), 16, 1)  # host to device
                before = {e.pid: e for e in ledger.read_entries(ledger_dir, 0)}
                for _ in range(CALLS):
                    session.execute_model(mid, [(x, 16)], [(y, 16)])
                got = bytearray(16)
                session.memcpy(got, 16, y, 16, 2)  # device to host
                out = np.frombuffer(bytes(got), dtype="<f4")
                after = {e.pid: e for e in ledger.read_entries(ledger_dir, 0)}
        finally:
            tenant.stop()
    assert tenant.error is None, tenant.error
    assert out.tolist() == [1.0, 3.0, 5.0, 7.0], "outputs computed during the slice, ready at its end"
    mine, theirs = after[lc.proc.pid], after[batch.proc.pid]
    assert mine.consumed_us - before[lc.proc.pid].consumed_us == CALLS * COST_US, "die time: what it executed"
    assert sum(mine.delay_buckets) - sum(before[lc.proc.pid].delay_buckets) == CALLS
    assert theirs.preempted > before[batch.proc.pid].preempted, "latency-critical slices went in between"
    assert mine.preempted == 0
