"""aclserver footprint and start-up: PSS of an idle aclserver (from /proc/<pid>/smaps_rollup,
target <= 30 MiB), before and after serving a client, and spawn -> ready -> first call times
(target: first call <= 150 ms p50 after the spawn).

Usage: ``.venv/bin/python bench/bench_aclserver_memory.py [--starts 10]``.
"""

from __future__ import annotations

import argparse
import shutil
import time

from _aclbench import med, p99, workdir

from flexnpu_client import Session
from flexnpu_testing import aclserver_harness


def pss_kib(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if parts[0] in ("Rss:", "Pss:", "Pss_Anon:", "Pss_File:", "Pss_Shmem:"):
                out[parts[0].rstrip(":")] = int(parts[1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=10)
    args = parser.parse_args()
    ready, first = [], []
    with workdir() as work:
        ledger_dir = str(work / "ledger")
        for _ in range(args.starts):
            spec = aclserver_harness.make_spec(
                work, shares=[aclserver_harness.share(0)], ledger_dir=ledger_dir
            )
            t = time.perf_counter()
            srv = aclserver_harness.start_aclserver(spec, work)
            ready.append(time.perf_counter() - t)
            try:
                with Session.open(srv.conf()) as s:
                    s.init()
                    s.get_device_count()
                    first.append(time.perf_counter() - t)
            finally:
                srv.stop()
                shutil.rmtree(spec.shm_dir, ignore_errors=True)
        with aclserver_harness.running_aclserver(
            work, shares=[aclserver_harness.share(0, memory=1 << 30)], ledger_dir=ledger_dir
        ) as srv:
            idle = pss_kib(srv.proc.pid)
            with Session.open(srv.conf()) as s:
                s.init()
                s.set_device(0)
                ptr = s.malloc(64 << 20)
                s.copy_to_device(ptr, b"x" * (8 << 20))
                busy = pss_kib(srv.proc.pid)
            after = aclserver_harness.wait_for(lambda: pss_kib(srv.proc.pid) if srv.proc.pid else None)
    print(f"start-up over {args.starts} spawns (python -m flexnpu_runtime.aclserver, no zygote):")
    print(f"  spawn -> ready file      median {med(ready) * 1e3:6.1f} ms  p99 {p99(ready) * 1e3:6.1f} ms")
    print(
        f"  spawn -> first call done median {med(first) * 1e3:6.1f} ms  p99 {p99(first) * 1e3:6.1f} ms  (target <= 150 ms p50)"
    )
    for name, row in (("idle", idle), ("client connected, 64 MiB allocated", busy), ("idle again", after)):
        print(
            f"  PSS {name:36} {row['Pss'] / 1024:6.1f} MiB  (RSS {row['Rss'] / 1024:6.1f} MiB,"
            f" anon {row.get('Pss_Anon', 0) / 1024:.1f}, file {row.get('Pss_File', 0) / 1024:.1f},"
            f" shmem {row.get('Pss_Shmem', 0) / 1024:.1f})"
        )
    print("  target: idle PSS <= 30 MiB")


if __name__ == "__main__":
    main()
