"""Idle cost of flexnpu-daemon and its aclservers with N prepared claims (target: daemon <= 0.5 % of a core).

Starts a real daemon (zygote launcher, emulated inventory), registers ``-n`` claims, then measures
CPU time over ``--window`` seconds in two interleaved kinds of window: quiet (nothing calls the
daemon: what its exit monitor costs) and watched (a ``List`` every 2 s, as the node process's
aclserver watch does). Prints the daemon's and the aclservers' CPU as a percent of one core.

    .venv/bin/python bench/bench_daemon_idle.py [-n 128] [--window 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from dra_driver.daemon_api.client import DaemonClient
from dra_driver.daemon_api.values import RegisterRequest
from flexnpu_runtime.daemon import processes, shmfs
from flexnpu_testing import inventories
from flexnpu_testing.daemon import remove_cgroups
from flexnpu_wire.shares import Share

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def window(daemon: int, acls: list[int], seconds: float, client: DaemonClient | None) -> tuple[float, float]:
    d0, a0 = cpu_seconds(daemon), sum(cpu_seconds(p) for p in acls)
    t0 = time.monotonic()
    next_list = t0
    while (now := time.monotonic()) < t0 + seconds:
        if client is not None and now >= next_list:
            client.list()
            next_list += 2.0
        time.sleep(min(0.05, max(0.0, t0 + seconds - now)))
    elapsed = time.monotonic() - t0
    d1, a1 = cpu_seconds(daemon), sum(cpu_seconds(p) for p in acls)
    return 100 * (d1 - d0) / elapsed, 100 * (a1 - a0) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fni-", dir="/tmp"))
    shm = Path(tempfile.mkdtemp(prefix="fni-", dir="/dev/shm"))
    sock = root / "d.sock"
    argv = [
        sys.executable, "-m", "flexnpu_runtime.daemon.main", "--socket", str(sock), "--state-dir", str(root / "state"),
        "--run-dir", str(root / "run"), "--shm-root", str(shm), "--log-level", "WARNING",
        "--inventory", str(inventories.path("eight-910b4.yaml")), "--cgroup-parent", f"flexnpu-bench-{root.name}",
    ]  # fmt: skip
    with (root / "daemon.log").open("wb") as log:
        daemon = subprocess.Popen(argv, stdout=log, stderr=log)
    client = DaemonClient(sock, timeout=60)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client.health()
                break
            except Exception:
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit((root / "daemon.log").read_text()) from None
                time.sleep(0.05)
        for i in range(args.n):
            share = Share(0, i % 8, 128 << 20, 0, "best-effort", memory_only=True)
            client.register(RegisterRequest(str(uuid.uuid4()), "bench", f"c{i}", "ab" * 16, (share,)))
        acls = [
            pid for pid, _ in processes.find_aclservers(root / "run" / "aclservers", run_dir=root / "run")
        ]
        assert len(acls) == args.n, (len(acls), args.n)
        rows: dict[str, list[tuple[float, float]]] = {"quiet": [], "List every 2 s": []}
        for r in range(args.rounds):
            order = ["quiet", "List every 2 s"] if r % 2 == 0 else ["List every 2 s", "quiet"]
            for kind in order:
                rows[kind].append(window(daemon.pid, acls, args.window, client if kind != "quiet" else None))
        print(
            f"{args.n} registered claims, {args.rounds} rounds of {args.window:.0f} s windows (percent of one core)"
        )
        print(f"{'window':16} {'daemon %':>9} {'aclservers % (all)':>19}")
        for kind, xs in rows.items():
            d = sorted(x[0] for x in xs)[len(xs) // 2]
            a = sorted(x[1] for x in xs)[len(xs) // 2]
            print(f"{kind:16} {d:9.2f} {a:19.2f}")
        print("target: daemon <= 0.5 % of a core")
    finally:
        client.close()
        daemon.terminate()
        daemon.wait(10)
        for pid, _ in processes.find_aclservers(root / "run" / "aclservers", run_dir=root / "run"):
            st = processes.stat(pid)
            if st is not None:
                processes.stop_group(pid, start_time=st.start_time, timeout=2)
        shmfs.unmount_all_under(shm)
        remove_cgroups(f"flexnpu-bench-{root.name}")
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)


if __name__ == "__main__":
    main()
