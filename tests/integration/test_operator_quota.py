"""Emulated operators on two shares of one die, fixed 30 % and 70 % (issue 24's Done-when split, +- 3 points).

Two real aclservers (one per claim, as flexnpu-daemon runs them) on one die ledger; in each, a lightweight
client (``flexnpu_client.Session`` over the real unix socket, no torch) keeps the share's stream queue full
of float32 ``MatMul`` operators — one OPERATOR message each, unanswered, as libascendcl sends them — in
batches on two streams, synchronizing one batch while the other queues. numpy computes a 256x256 product
slower than the cost model's 0.67 ms on this host: host-bound operators, which before the die held the host's
compute got far below their quotas. The split is read from the ledger (``consumed_us`` of each share's
entry) over a 3 s window after a warm-up, not from wall-clock timings of the clients: a loaded machine
slows the compute, which is then charged as die time, and the fixed quotas still divide the die.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import numpy as np

from flexnpu_client.session import Session
from flexnpu_runtime.aclserver import ledger
from flexnpu_testing import aclserver_harness, opcall_writer
from flexnpu_testing.aclserver_harness import RunningAclServer
from flexnpu_testing.waiting import wait_for
from flexnpu_wire import opcall
from flexnpu_wire.clientconf import ClientConf
from flexnpu_wire.codes import Policy
from flexnpu_wire.framing import Op

N = 256
BATCH = 24
WARMUP_S = 1.0
WINDOW_S = 3.0
_F32 = 0


class MatmulTenant:
    """A client that keeps its share busy with ``MatMul`` operators until stopped."""

    def __init__(self, conf: ClientConf) -> None:
        self.conf = conf
        self.batches = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="matmul-tenant")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the tenant's last synchronize did not return"

    def _run(self) -> None:
        try:
            with Session.open(self.conf) as s:
                s.init()
                s.set_device(0)
                size = N * N * 4
                a, b, c = (s.malloc(size) for _ in range(3))
                rng = np.random.default_rng(0)
                for ptr in (a, b):
                    s.copy_to_device(ptr, rng.standard_normal((N, N), dtype=np.float32).tobytes())

                def dev(ptr: int) -> opcall.Tensor:
                    return opcall.Tensor(
                        opcall.Placement.DEVICE, _F32, dims=(N, N), address=ptr, storage_bytes=size
                    )

                tail = opcall_writer.encode("MatMul", [dev(a), dev(b)], [dev(c)])
                streams = [s.create_stream(), s.create_stream()]
                i = 0
                while not self._stop.is_set():
                    for _ in range(BATCH):
                        s.link.send(Op.OPERATOR, (streams[i % 2], 2, 1, 0), tail)
                    if i:
                        s.synchronize_stream(
                            streams[(i + 1) % 2]
                        )  # an operator's failure would be raised here
                        self.batches += 1
                    i += 1
                s.synchronize_device()
        except BaseException as exc:  # reported to the test thread
            self.error = exc


def _consumed(ledger_dir: str, pids: list[int]) -> list[int]:
    by_pid = {e.pid: e.consumed_us for e in ledger.read_entries(ledger_dir, 0)}
    return [by_pid[p] for p in pids]


def test_two_fixed_shares_running_host_bound_matmuls_split_the_die_30_70(tmp_path: Path) -> None:
    ledger_dir = str(tmp_path / "ledger")
    with contextlib.ExitStack() as stack:
        running: list[RunningAclServer] = [
            stack.enter_context(
                aclserver_harness.running_aclserver(
                    tmp_path,
                    ledger_dir=ledger_dir,
                    shares=[
                        aclserver_harness.share(0, die=0, compute=pct, policy=Policy.FIXED, memory=64 << 20)
                    ],
                )
            )
            for pct in (30, 70)
        ]
        pids = [s.proc.pid for s in running]
        tenants = [MatmulTenant(s.conf()) for s in running]
        stack.callback(lambda: [t.stop() for t in tenants])
        wait_for(
            lambda: all(t.batches >= 2 or t.error for t in tenants), timeout=60, what="both tenants running"
        )
        pause = threading.Event()
        pause.wait(WARMUP_S)  # a measurement window, not synchronisation
        t0, before = time.monotonic(), _consumed(ledger_dir, pids)
        pause.wait(WINDOW_S)
        t1, after = time.monotonic(), _consumed(ledger_dir, pids)
        done = [t.batches for t in tenants]
        for t in tenants:
            t.stop()
        assert [t.error for t in tenants] == [None, None]
    shares = [(b - a) / 1e6 / (t1 - t0) for a, b in zip(before, after, strict=True)]
    assert abs(shares[0] - 0.30) <= 0.03 and abs(shares[1] - 0.70) <= 0.03, (
        f"die shares {shares} for quotas 30/70 (batches of {BATCH} done: {done})"
    )
