"""Latency-critical shares (issue 26, ``docs/latency.md``): one emulated die per scenario, blocks interleaved.

* **lc alone / lc + batch**: a latency-critical tenant (C client, ``bench/c/model_bench.c``, elastic 50 %)
  executes a 1 ms model synchronously, open loop, one every ``--interval-us`` (4 ms: half its quota),
  alone and next to a batch tenant (Python client, elastic 50 %, priority batch) saturating the die with
  5 ms kernels. Goals: p99 <= 1.3x and p50 <= 1.1x of alone; the batch tenant fills >= 90 % of the die
  time the latency-critical one leaves (both from the die ledger over the block).
* **normal + normal**: the same pair with both priorities normal, on another die (what the issue measured).
* **fixed 30/70 sync**: two C clients executing 1 ms models back to back on fixed 30 % and 70 % shares of
  one die. Goals: 30/70 +- 3 points, die idle < 3 %.
* **sync alone**: 1 ms executions back to back on an idle die (fixed 100 %). Goal: p50 <= 1.05x its
  declared die time (on a quiet machine).

Also prints the latency-critical share's queueing-delay histogram and the batch share's slices preempted,
from the ledger. The load average is printed first and last: the figures depend on it.
Usage: ``.venv/bin/python bench/bench_latency.py [--blocks 6] [--calls 250] [--interval-us 4000] [--only sync]``;
``--only sync`` runs just the synchronous scenarios (fixed 30/70 sync, sync alone: about a minute),
``--only pairs`` just the latency-critical and normal pairs; ``--against /work/main`` also runs the sync
scenarios on aclservers started from another checkout's code, interleaved (a before/after under one load).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from _aclbench import med, p99, workdir
from bench_models import CRunner, model

from flexnpu_runtime.aclserver import ledger
from flexnpu_testing import aclserver_harness
from flexnpu_testing.aclserver_harness import RunningAclServer, Tenant
from flexnpu_wire import clientconf
from flexnpu_wire import modelfile as mf
from flexnpu_wire.codes import Policy, Priority

MIB = 1 << 20


def consumed(ledger_dir: str, die: int) -> dict[int, int]:
    """aclserver pid -> die microseconds it used so far."""
    return {e.pid: e.consumed_us for e in ledger.read_entries(ledger_dir, die)}


def client(work: Path, server: RunningAclServer, model_path: Path, name: str) -> CRunner:
    (conf := work / f"{name}.conf").write_text(clientconf.render(server.conf()))
    return CRunner(model_path, conf)


class Pair:
    """A latency-critical-or-not C tenant and a saturating tenant on one die."""

    def __init__(
        self, stack: contextlib.ExitStack, work: Path, ledger_dir: str, die: int, first: Priority, second: Priority,
        model_path: Path,
    ) -> None:  # fmt: skip
        def start(priority: Priority) -> RunningAclServer:
            shares = [
                aclserver_harness.share(0, die=die, compute=50, policy=Policy.ELASTIC, priority=priority)
            ]
            return stack.enter_context(
                aclserver_harness.running_aclserver(work, shares=shares, ledger_dir=ledger_dir)
            )

        self.die, self.ledger_dir = die, ledger_dir
        self.online, self.batch = start(first), start(second)
        self.c = client(work, self.online, model_path, f"online-{die}")
        stack.callback(self.c.close)

    def run(self, calls: int, interval_us: int, *, busy: bool) -> tuple[list[float], float, float]:
        """Latencies (seconds, from each call's start) of one open-loop block; the online and the
        batch tenant's fractions of the die over it."""
        tenant = Tenant(self.batch.conf(), kernel_us=5_000).start() if busy else None
        try:
            if tenant is not None:
                time.sleep(0.3)  # a bench, not a test: let the batch tenant fill the die first
            t0, e0 = time.monotonic(), consumed(self.ledger_dir, self.die)
            lines = self.c.command(f"{calls} {interval_us}")
            t1, e1 = time.monotonic(), consumed(self.ledger_dir, self.die)
        finally:
            if tenant is not None:
                tenant.stop()
        span = (t1 - t0) * 1e6

        def frac(server: RunningAclServer) -> float:
            pid = server.proc.pid
            return (e1.get(pid, 0) - e0.get(pid, 0)) / span

        return [int(line.split()[1]) / 1e9 for line in lines], frac(self.online), frac(self.batch)


class SyncDies:
    """The synchronous scenarios on two dies of their own: fixed 30/70 callers, and a caller alone.

    ``tree``: start these aclservers from another checkout's code (``--against``), for a baseline
    measured in the same run, interleaved, under the same load."""

    def __init__(
        self, stack: contextlib.ExitStack, work: Path, ledger_dir: str, dies: tuple[int, int], model_path: Path,
        name: str, tree: str | None = None,
    ) -> None:  # fmt: skip
        def start(die: int, quota: int) -> RunningAclServer:
            with from_tree(tree):
                return stack.enter_context(
                    aclserver_harness.running_aclserver(
                        work, shares=[aclserver_harness.share(0, die=die, compute=quota, policy=Policy.FIXED)],
                        ledger_dir=ledger_dir,
                    )
                )  # fmt: skip

        self.ledger_dir, self.die = ledger_dir, dies[0]
        self.f30, self.f70, alone = start(dies[0], 30), start(dies[0], 70), start(dies[1], 100)
        self.c30 = client(work, self.f30, model_path, f"{name}-f30")
        self.c70 = client(work, self.f70, model_path, f"{name}-f70")
        self.c_alone = client(work, alone, model_path, f"{name}-alone")
        for c in self.clients():
            stack.callback(c.close)
        self.fixed: list[tuple[float, float]] = []
        self.alone: list[float] = []

    def clients(self) -> list[CRunner]:
        return [self.c30, self.c70, self.c_alone]

    def fixed_block(self, ms: int) -> None:
        """Both callers back to back for ``ms``; the die fractions they got, from the ledger."""
        e0, t0 = consumed(self.ledger_dir, self.die), time.monotonic()
        for c in (self.c30, self.c70):
            assert c.proc.stdin is not None
            c.proc.stdin.write(f"t {ms}\n")
            c.proc.stdin.flush()
        for c in (self.c30, self.c70):
            assert c.proc.stdout is not None
            while c.proc.stdout.readline().strip() != "done":
                pass
        e1, t1 = consumed(self.ledger_dir, self.die), time.monotonic()
        span = (t1 - t0) * 1e6
        a, b = ((e1[s.proc.pid] - e0[s.proc.pid]) / span for s in (self.f30, self.f70))
        self.fixed.append((a, b))

    def report(self, label: str) -> None:
        a = sum(f[0] for f in self.fixed) / len(self.fixed)
        b = sum(f[1] for f in self.fixed) / len(self.fixed)
        xs = self.alone
        print(
            f"  {label}fixed 30/70, 1 ms sync each: {a * 100:5.1f} / {b * 100:5.1f} %"
            f" ({(a - 0.3) * 100:+.1f} / {(b - 0.7) * 100:+.1f} pts, goal +-3), die idle {(1 - a - b) * 100:4.1f} %"
            f" (goal < 3 %)\n"
            f"  {label}sync alone, 1 ms declared: p50 {med(xs) * 1e3:6.3f} ms  p99 {p99(xs) * 1e3:6.3f} ms"
            f"   p50 {med(xs) / 1e-3:.3f}x its die time (goal <= 1.05x)"
        )


@contextlib.contextmanager
def from_tree(tree: str | None) -> Iterator[None]:
    """Processes started meanwhile import the project from ``tree`` (``python -m`` puts the working
    directory first on the path, so both it and PYTHONPATH point there; the wire package from its
    ``client/``)."""
    if tree is None:
        yield
        return
    cwd, old = os.getcwd(), os.environ.get("PYTHONPATH")
    os.chdir(tree)
    os.environ["PYTHONPATH"] = os.pathsep.join([tree, os.path.join(tree, "client")])
    try:
        yield
    finally:
        os.chdir(cwd)
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--calls", type=int, default=250)
    parser.add_argument("--interval-us", type=int, default=4000)
    parser.add_argument("--fixed-ms", type=int, default=2000)
    parser.add_argument(
        "--only", choices=("all", "sync", "pairs"), default="all",
        help="sync: the fixed 30/70 sync callers and a sync call alone; pairs: the latency-critical and normal pairs",
    )  # fmt: skip
    parser.add_argument(
        "--against", metavar="TREE",
        help="also run the sync scenarios on aclservers started from TREE's code (e.g. /work/main), interleaved",
    )  # fmt: skip
    args = parser.parse_args()
    pairs, syncs = args.only in ("all", "pairs"), args.only in ("all", "sync")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cpus)")
    lat: dict[str, list[float]] = {
        k: [] for k in ("lc alone", "lc + batch", "normal alone", "normal + normal")
    }
    fill: dict[str, list[tuple[float, float]]] = {"lc + batch": [], "normal + normal": []}
    with workdir() as work, contextlib.ExitStack() as stack:
        ledger_dir = str(work / "ledger")
        (model_path := work / "one-ms.fnm").write_bytes(mf.render(model(1_000)))
        arms: list[Callable[[], None]] = []
        warm: list[CRunner] = []
        if pairs:
            lc = Pair(stack, work, ledger_dir, 0, Priority.LATENCY_CRITICAL, Priority.BATCH, model_path)
            normal = Pair(stack, work, ledger_dir, 1, Priority.NORMAL, Priority.NORMAL, model_path)

            def pair_block(name: str, pair: Pair, busy: bool) -> None:
                xs, mine, other = pair.run(args.calls, args.interval_us, busy=busy)
                lat[name] += xs
                if busy:
                    fill[name].append((mine, other))

            arms += [
                lambda: pair_block("lc alone", lc, False),
                lambda: pair_block("lc + batch", lc, True),
                lambda: pair_block("normal alone", normal, False),
                lambda: pair_block("normal + normal", normal, True),
            ]
            warm += [lc.c, normal.c]
        syncs_by: dict[str, SyncDies] = {}
        if syncs:
            syncs_by["this tree"] = SyncDies(stack, work, ledger_dir, (2, 3), model_path, "this")
            if args.against:
                syncs_by[args.against] = SyncDies(
                    stack, work, ledger_dir, (4, 5), model_path, "base", os.path.abspath(args.against)
                )
            for dies in syncs_by.values():
                arms += [
                    functools.partial(dies.fixed_block, args.fixed_ms),
                    functools.partial(lambda d: d.alone.extend(d.c_alone.block(args.calls)), dies),
                ]
                warm += dies.clients()
        for c in warm:  # warm up: the first calls load numpy and fault pages in
            c.block(20)
        for block in range(args.blocks):
            for i in range(len(arms)):
                arms[(i + block) % len(arms)]()
        if pairs:
            histogram = {e.pid: e for e in ledger.read_entries(ledger_dir, 0)}
            lc_entry, batch_entry = histogram[lc.online.proc.pid], histogram[lc.batch.proc.pid]
    print(f"{args.blocks} interleaved blocks ({args.only})")
    if pairs:
        report_pairs(args, lat, fill, lc_entry.delay_buckets, batch_entry.preempted)
    for label, dies in syncs_by.items():
        dies.report(f"[{label}] " if args.against else "")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def report_pairs(
    args: argparse.Namespace,
    lat: dict[str, list[float]],
    fill: dict[str, list[tuple[float, float]]],
    delay_buckets: tuple[int, ...],
    preempted: int,
) -> None:
    print(f"  open loop: {args.calls} calls of a 1 ms model every {args.interval_us} us")
    for online, busy in (("lc", "lc + batch"), ("normal", "normal + normal")):
        base, xs = lat[f"{online} alone"], lat[busy]
        mine = sum(f[0] for f in fill[busy]) / len(fill[busy])
        other = sum(f[1] for f in fill[busy]) / len(fill[busy])
        print(
            f"  {online + ' alone':16} p50 {med(base) * 1e3:6.3f} ms  p99 {p99(base) * 1e3:6.3f} ms\n"
            f"  {busy:16} p50 {med(xs) * 1e3:6.3f} ms  p99 {p99(xs) * 1e3:6.3f} ms"
            f"   p50 {med(xs) / med(base):.2f}x (goal <= 1.10x)  p99 {p99(xs) / p99(base):.2f}x (goal <= 1.30x)\n"
            f"  {'':16} die: online {mine * 100:5.1f} %, batch {other * 100:5.1f} % = fills"
            f" {other / (1 - mine) * 100:5.1f} % of what the online tenant leaves (goal >= 90 %),"
            f" idle {(1 - mine - other) * 100:4.1f} %"
        )
    bounds = [*(f"<={b * 1e6:.0f}us" for b in ledger.DELAY_BUCKETS_S), "more"]
    spread = ", ".join(f"{b} {n}" for b, n in zip(bounds, delay_buckets, strict=True) if n)
    print(f"  latency-critical share's queueing delay (tasks per bucket): {spread}")
    print(f"  batch share's slices preempted: {preempted}")


if __name__ == "__main__":
    main()
