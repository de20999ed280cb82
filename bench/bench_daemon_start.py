"""Benchmark: flexnpu-daemon register → first call served, per launcher; and the daemon's RSS.

Starts a real daemon (emulated inventory, temp dirs, a short unix socket under /tmp) per
launcher, registers N claims one after another and measures, for each, the time from the
Register call to the first PONG on the aclserver's unix socket (connect + PING). Also reports
unregister latency and the RSS of the daemon (and of its zygote).

    .venv/bin/python bench/bench_daemon_start.py [-n 30] [--launcher zygote spawn]
"""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from dra_driver.daemon_api.client import DaemonClient
from dra_driver.daemon_api.values import RegisterRequest
from flexnpu_runtime.daemon import processes
from flexnpu_testing import inventories
from flexnpu_testing.daemon import remove_cgroups
from flexnpu_wire import framing as protocol
from flexnpu_wire.shares import Share


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def ping(path: str) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(path)
        s.sendall(protocol.encode(protocol.Op.PING, 1))
        msg = protocol.FrameReader(s, 1 << 20).read()
    assert msg is not None and msg.ints[0] == 0
    return msg.ints[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(launcher: str, n: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="fnb-", dir="/tmp"))
    shm = Path(tempfile.mkdtemp(prefix="fnb-", dir="/dev/shm"))
    sock = root / "d.sock"
    argv = [
        sys.executable,
        "-m",
        "flexnpu_runtime.daemon.main",
        "--socket",
        str(sock),
        "--state-dir",
        str(root / "state"),
        "--run-dir",
        str(root / "run"),
        "--shm-root",
        str(shm),
        "--cgroup-parent",
        f"flexnpu-bench-{root.name}",
        "--log-level",
        "WARNING",
        "--launcher",
        launcher,
        "--inventory",
        str(inventories.path("eight-910b4.yaml")),
    ]
    t0 = time.monotonic()
    with (root / "daemon.log").open("wb") as log:
        daemon = subprocess.Popen(argv, stdout=log, stderr=log)
    client = DaemonClient(sock, timeout=30)
    try:
        while True:
            try:
                client.health()
                break
            except Exception:
                if daemon.poll() is not None or time.monotonic() - t0 > 30:
                    raise SystemExit((root / "daemon.log").read_text()) from None
                time.sleep(0.01)
        ready_s = time.monotonic() - t0
        first_call: list[float] = []
        register_only: list[float] = []
        uids = []
        for i in range(n):
            uid = str(uuid.uuid4())
            req = RegisterRequest(uid, "bench", f"c{i}", "ab" * 16, (Share(0, i % 8, 256 << 20, 3, "fixed"),))
            t = time.perf_counter()
            res = client.register(req)
            t_reg = time.perf_counter()
            assert ping(res.endpoints.unix_socket) == res.pid
            t_ping = time.perf_counter()
            register_only.append(t_reg - t)
            first_call.append(t_ping - t)
            uids.append(uid)
        daemon_rss = rss_kib(daemon.pid)
        zygote_rss = [
            rss_kib(pid)
            for pid in _children(daemon.pid)
            if "flexnpu_runtime.daemon.zygote" in (processes.cmdline(pid) or ())
        ]
        acl_rss = [
            rss_kib(pid)
            for pid, _ in processes.find_aclservers(root / "run" / "aclservers", run_dir=root / "run")
        ]
        unreg: list[float] = []
        for uid in uids:
            t = time.perf_counter()
            client.unregister(uid)
            unreg.append(time.perf_counter() - t)
        ms = 1000.0
        print(f"launcher={launcher} n={n} daemon-ready={ready_s * ms:.0f} ms")
        print(
            f"  register->first PONG: p50 {statistics.median(first_call) * ms:.1f} ms"
            f"  p99 {pct(first_call, 0.99) * ms:.1f} ms  min {min(first_call) * ms:.1f}  max {max(first_call) * ms:.1f}"
        )
        print(
            f"  Register RPC alone:   p50 {statistics.median(register_only) * ms:.1f} ms  p99 {pct(register_only, 0.99) * ms:.1f} ms"
        )
        print(
            f"  Unregister RPC:       p50 {statistics.median(unreg) * ms:.1f} ms  p99 {pct(unreg, 0.99) * ms:.1f} ms"
        )
        print(
            f"  RSS: daemon {daemon_rss / 1024:.1f} MiB; zygote {', '.join(f'{r / 1024:.1f}' for r in zygote_rss) or '-'} MiB;"
            f" aclserver median {statistics.median(acl_rss) / 1024 if acl_rss else -1:.1f} MiB"
        )
    finally:
        client.close()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=15)
        for pid, _ in processes.find_aclservers(root / "run" / "aclservers", run_dir=root / "run"):
            processes.stop_group(
                pid, start_time=processes.stat(pid).start_time if processes.stat(pid) else 0, timeout=1
            )
        remove_cgroups(f"flexnpu-bench-{root.name}")
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = processes.stat(int(entry.name))
            if st is not None and st.ppid == pid and st.state != "Z":
                out.append(st.pid)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=30)
    parser.add_argument("--launcher", nargs="+", default=["zygote", "spawn"])
    args = parser.parse_args()
    for launcher in args.launcher:
        run(launcher, args.n)


if __name__ == "__main__":
    main()
