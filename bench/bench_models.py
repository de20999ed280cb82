"""Model execution through the aclserver vs the emulated backend called directly, interleaved.

* remote, C: ``aclmdlExecute`` through libascendcl.so (``bench/c/model_bench.c``, kept running)
  of a model whose execution holds the die for ``--cost-us`` (1 ms by default), against a real
  aclserver over its unix socket;
* remote, Python: the same through the Python client (``Session.execute_model``, stream 0);
* direct: the same model loaded into an ``EmulatedBackend`` in this process and executed as the
  aclserver executes a synchronous call on an idle device (``Streams.run_now`` on the calling
  thread: die slices from the ledger, the die held by the same timed wait, then the outputs),
  with no socket, no framing, no client. Both sides pay the same emulation cost (ledger, sleep
  overshoot, numpy compute), so the ratio measures FlexNPU's overhead only.
* direct, queued: the same, handed to the stream's worker thread and waited for (what the
  aclserver does when the device already has work queued; the baseline before run_now existed).

Each runs on its own emulated die at 100 % compute (fixed), in alternating blocks. Prints the
median and p99 of each and the ratio of medians to direct (goal: <= 1.05x for a 1 ms model).
Usage: ``.venv/bin/python bench/bench_models.py [--cost-us 1000] [--blocks 20] [--per 50]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from _aclbench import med, p99, workdir

from flexnpu_client import Session
from flexnpu_runtime.aclserver.backend import Buffer
from flexnpu_runtime.aclserver.backend_emulated import EmulatedBackend
from flexnpu_runtime.aclserver.streams import Streams, Task
from flexnpu_testing import aclserver_harness, clibrary
from flexnpu_wire import clientconf
from flexnpu_wire import modelfile as mf

HERE = Path(__file__).parent
MIB = 1 << 20


def model(cost_us: int) -> mf.ModelFile:
    t = mf.Tensor("x", 0, mf.FORMAT_ND, (256,))
    return mf.ModelFile(
        inputs=(t,), outputs=(mf.Output(mf.Tensor("y", 0, mf.FORMAT_ND, (256,)), mf.Op.AFFINE, 0, 0, 2.0, 1.0),),
        cost_us=cost_us, work_bytes=4096,
    )  # fmt: skip


def python_runner(session: Session, data: bytes) -> Callable[[], float]:
    mid = session.load_model(data)
    x, y = session.malloc(1024), session.malloc(1024)

    def once() -> float:
        t0 = time.perf_counter()
        session.execute_model(mid, [(x, 1024)], [(y, 1024)])
        return time.perf_counter() - t0

    return once


class CRunner:
    """bench/c/model_bench.c kept running: each block is one line to it, its timings back."""

    def __init__(self, model_path: Path, conf: Path) -> None:
        exe = clibrary.compile_program(HERE / "c" / "model_bench.c", link_library=clibrary.build_library())
        env = {**os.environ, "FLEXNPU_CONF": str(conf)}
        self.proc = subprocess.Popen(
            [str(exe), str(model_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def block(self, n: int) -> list[float]:
        return [int(line.split()[1]) / 1e9 for line in self.command(str(n))]

    def command(self, line: str) -> list[str]:
        """Send one block's line (see model_bench.c); the lines it printed before ``done``."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{line}\n")
        self.proc.stdin.flush()
        out = []
        while (got := self.proc.stdout.readline().strip()) != "done":
            if not got:
                raise RuntimeError(f"model_bench ended during {line!r} (exit {self.proc.poll()})")
            out.append(got)
        return out

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(30)


def direct_runners(
    backend: EmulatedBackend, data: bytes
) -> tuple[Callable[[], float], Callable[[], float], Streams]:
    desc = backend.describe_model(memoryview(data))
    work = backend.malloc(0, desc.work_bytes, 0, owner=1)
    loaded = backend.load_model(
        0, memoryview(bytearray(data)), desc, weight=None,
        work=Buffer(work, desc.work_bytes, backend.book.find(work, owner=1)),
    )  # fmt: skip
    streams = Streams(backend, backend.book, session_id=1, current=lambda: 0)
    stream = streams.create(0)
    own = [loaded.work.alloc] if loaded.work else []
    bufs = []
    for _ in range(2):
        ptr = backend.malloc(0, 1024, 0, owner=1)
        bufs.append(Buffer(ptr, 1024, backend.book.find(ptr, owner=1)))

    def once() -> float:
        t0 = time.perf_counter()
        cost, run = backend.execution(loaded, bufs[:1], bufs[1:], batch=0, hw=(0, 0))
        task = Task(stream, cost, run)
        assert streams.run_now(task, [*own, *(b.alloc for b in bufs)], streams.cancelled)
        return time.perf_counter() - t0

    def queued() -> float:
        t0 = time.perf_counter()
        cost, run = backend.execution(loaded, bufs[:1], bufs[1:], batch=0, hw=(0, 0))
        task = Task(stream, cost, run)
        streams.submit(task, [*own, *(b.alloc for b in bufs)])
        task.done.wait()
        return time.perf_counter() - t0

    return once, queued, streams


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cost-us", type=int, default=1000)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--per", type=int, default=50)
    args = parser.parse_args()
    data = mf.render(model(args.cost_us))
    with workdir() as work, aclserver_harness.running_aclserver(
        work, shares=[aclserver_harness.share(0, die=0, memory=64 * MIB, compute=100)], ledger_dir=str(work / "ledger")
    ) as server, Session.open(server.conf()) as session:  # fmt: skip
        session.init()
        session.set_device(0)
        spec = aclserver_harness.make_spec(
            work, shares=[aclserver_harness.share(0, die=1, memory=64 * MIB, compute=100)], ledger_dir=str(work / "ledger")
        )  # fmt: skip
        backend = EmulatedBackend(spec)
        direct, queued, streams = direct_runners(backend, data)
        python = python_runner(session, data)
        (model_path := work / "bench.fnm").write_bytes(data)
        (conf := work / "client.conf").write_text(clientconf.render(server.conf()))
        c_client = CRunner(model_path, conf)
        runs: dict[str, Callable[[], list[float]]] = {
            "remote, C": lambda: c_client.block(args.per),
            "remote, Python": lambda: [python() for _ in range(args.per)],
            "direct": lambda: [direct() for _ in range(args.per)],
            "direct, queued": lambda: [queued() for _ in range(args.per)],
        }
        got: dict[str, list[float]] = {name: [] for name in runs}
        try:
            for block in range(args.blocks + 1):
                for name, run in runs.items():
                    times = run()
                    if block:  # the first block warms everything up
                        got[name] += times
        finally:
            c_client.close()
            streams.close()
            backend.close()
    print(f"model execution, {args.cost_us} us of die each, {args.blocks} interleaved blocks of {args.per}")
    base = med(got["direct"])
    for name, xs in got.items():
        print(
            f"  {name:15} p50 {med(xs) * 1e3:7.3f} ms   p99 {p99(xs) * 1e3:7.3f} ms"
            f"   p50 {med(xs) / base:.3f}x direct (+{(med(xs) - base) * 1e6:.0f} us)"
        )


if __name__ == "__main__":
    main()
