"""The daemon's API while a tenant's socket trickles (issue 25, class 4): Health and probing List latency.

A real daemon (its default aclserver) serves two claims; the tenant of one replaced its
aclserver's socket in its shm dir with one that answers PING a byte every 0.5 s
(``tests/integration/test_daemon_tenant_socket.py``'s ``TrickleSocket``). Rounds interleave two
kinds of window: quiet (only Health calls) and attacked (nine ``List(probe=True)`` in flight at
once, re-issued as they end, while Health is called). Prints medians and p99 of Health and of a
probing List in each, and the attacked/quiet ratio of Health's median, measured in the same run.

    .venv/bin/python bench/bench_daemon_tenant_socket.py [--rounds 4] [--samples 25]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flexnpu_testing.daemon import DaemonProc, request, share
from tests.integration.test_daemon_tenant_socket import TrickleSocket


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--samples", type=int, default=25)
    args = parser.parse_args()
    daemon = DaemonProc().start()
    fake: TrickleSocket | None = None
    try:
        with daemon.client() as c:
            tenant = c.register(request(str(uuid.uuid4()), share(0, vid=0, compute=20)))
            c.register(request(str(uuid.uuid4()), share(1, vid=0, compute=20)))
        path = Path(tenant.endpoints.unix_socket)
        os.unlink(path)
        fake = TrickleSocket(path, tenant.pid).start()
        health: dict[str, list[float]] = {"quiet": [], "attacked": []}
        lists: list[float] = []
        for _ in range(args.rounds):
            for kind in ("quiet", "attacked"):
                stop = threading.Event()
                workers = []
                if kind == "attacked":

                    def keep_listing(stop: threading.Event = stop) -> None:
                        with daemon.client(timeout=60) as lc:
                            while not stop.is_set():
                                t0 = time.monotonic()
                                lc.list(probe=True)
                                lists.append(time.monotonic() - t0)

                    workers = [threading.Thread(target=keep_listing) for _ in range(9)]
                    for w in workers:
                        w.start()
                with daemon.client(timeout=60) as hc:
                    for _ in range(args.samples):
                        t0 = time.monotonic()
                        hc.health()
                        health[kind].append(time.monotonic() - t0)
                stop.set()
                for w in workers:
                    w.join()
        load = os.getloadavg()[0]
        print(f"load average (1 min) at the end: {load:.1f} on {os.cpu_count()} CPUs")
        for kind, values in health.items():
            print(
                f"Health {kind:8s}: median {pct(values, 0.5) * 1e3:7.2f} ms, p99 {pct(values, 0.99) * 1e3:7.2f} ms"
                f" ({len(values)} calls)"
            )
        print(
            f"List(probe) attacked: median {pct(lists, 0.5) * 1e3:7.2f} ms, p99 {pct(lists, 0.99) * 1e3:7.2f} ms"
            f" ({len(lists)} calls)"
        )
        ratio = pct(health["attacked"], 0.5) / pct(health["quiet"], 0.5)
        print(f"Health median attacked/quiet: {ratio:.2f}; tenant socket connections: {fake.accepted}")
    finally:
        if fake is not None:
            fake.close()
        daemon.cleanup()


if __name__ == "__main__":
    main()
