"""Compute quotas on one emulated die shared by separate aclserver processes, over a 5 s window:
fixed 30/70 both saturating (target: each within +-3 points), fixed 30 alone (stays ~30),
elastic 30 busy with a 70 share idle (target >= 90 %), best-effort alone (uncapped).

Shares are measured by the clients (die time of kernels whose completion they observed) and,
for comparison, from the die ledger. Usage: ``.venv/bin/python bench/bench_compute.py [--window 5]``.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time

from _aclbench import workdir

from flexnpu_runtime.aclserver import ledger
from flexnpu_testing import aclserver_harness
from flexnpu_testing.aclserver_harness import Tenant
from flexnpu_wire.codes import Policy

SCENARIOS = [
    ("fixed 30/70, both busy", [(30, Policy.FIXED), (70, Policy.FIXED)], [0, 1], [0.30, 0.70]),
    ("fixed 30 busy, 70 idle", [(30, Policy.FIXED), (70, Policy.FIXED)], [0], [0.30]),
    ("elastic 30 busy, 70 idle", [(30, Policy.ELASTIC), (70, Policy.ELASTIC)], [0], [">=0.90"]),
    ("elastic 30/70, both busy", [(30, Policy.ELASTIC), (70, Policy.ELASTIC)], [0, 1], [0.30, 0.70]),
    ("best-effort 30 alone", [(30, Policy.BEST_EFFORT)], [0], ["uncapped"]),
]


def run(
    name: str, specs: list[tuple[int, Policy]], busy: list[int], target: list[object], window: float
) -> None:
    with workdir() as work, contextlib.ExitStack() as stack:
        ledger_dir = str(work / "ledger")
        servers = [
            stack.enter_context(
                aclserver_harness.running_aclserver(
                    work,
                    ledger_dir=ledger_dir,
                    shares=[aclserver_harness.share(0, die=0, compute=pct, policy=pol)],
                )
            )
            for pct, pol in specs
        ]
        tenants = [Tenant(servers[i].conf()).start() for i in busy]
        pause = threading.Event()
        pause.wait(0.5)
        t0 = time.monotonic()
        e0 = {e.pid: e.consumed_us for e in ledger.read_entries(ledger_dir, 0)}
        pause.wait(window)
        t1 = time.monotonic()
        e1 = {e.pid: e.consumed_us for e in ledger.read_entries(ledger_dir, 0)}
        for t in tenants:
            t.stop()
        for i, t in enumerate(tenants):
            pid = servers[busy[i]].proc.pid
            client = t.share(t0, t1)
            by_ledger = (e1[pid] - e0[pid]) / 1e6 / (t1 - t0)
            want = target[i]
            err = f"{(client - want) * 100:+.1f} pts" if isinstance(want, float) else ""
            print(
                f"{name:28} share {specs[busy[i]][0]:3d}%  client {client * 100:5.1f}%  ledger {by_ledger * 100:5.1f}%"
                f"  target {want if isinstance(want, str) else f'{want * 100:.0f}%':>9} {err}"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--window", type=float, default=5.0)
    args = parser.parse_args()
    print(f"window {args.window:.1f} s, kernels of 5 ms, period 100 ms")
    for scenario in SCENARIOS:
        run(*scenario, window=args.window)


if __name__ == "__main__":
    main()
