"""Control-link latency and throughput of the aclserver, against raw socket ping-pongs in the same run.

Latency (default mode): a get_mem_info round trip over the unix socket and over TCP, against a
raw ping-pong of the same frame sizes with a Python echo process. Baseline and measured blocks
are interleaved (``--rounds`` rounds of ``--block`` calls each, order rotating) so machine drift
lands on both; medians and p99 are over all blocks. Targets: p50 <= 1.5x and p99 <= 3x the raw
unix ping-pong.

Throughput (``--throughput``): small calls per second on one die, from client processes that
each hold one session, for N tenants = N claims (N aclservers on the die) and for N sessions of
one claim, N in ``--counts`` (default 4 16), interleaved over ``--rounds``. Target: the figure at
16 >= 0.9x the figure at 4.

Usage: ``.venv/bin/python bench/bench_roundtrip.py [--rounds 10] [--block 500] [--throughput]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from _aclbench import med, p99, workdir

from flexnpu_client import Session
from flexnpu_testing import aclserver_harness
from flexnpu_testing.aclserver_harness import RunningAclServer
from flexnpu_wire import clientconf
from flexnpu_wire import framing as protocol
from flexnpu_wire.codes import MemAttr
from flexnpu_wire.framing import Op

REQUEST = len(protocol.encode(Op.GET_MEM_INFO, 1, (int(MemAttr.HBM_MEM),)))
REPLY = len(protocol.encode_reply(Op.GET_MEM_INFO, 1, 0, 1, 2))

ECHO = f"""
import socket, sys
kind, addr = sys.argv[1], sys.argv[2]
if kind == "unix":
    srv = socket.socket(socket.AF_UNIX); srv.bind(addr)
else:
    srv = socket.create_server(("127.0.0.1", 0))
srv.listen(1)
print(srv.getsockname()[1] if kind == "tcp" else addr, flush=True)
conn, _ = srv.accept()
if kind == "tcp":
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
reply = b"x" * {REPLY}
while True:
    got = 0
    while got < {REQUEST}:
        data = conn.recv(65536)
        if not data:
            sys.exit(0)
        got += len(data)
    conn.sendall(reply)
"""

WORKER = """
import sys, time
from flexnpu_client import Session
conf, seconds = sys.argv[1], float(sys.argv[2])
s = Session.open(conf); s.init(); s.set_device(0)
for _ in range(200):
    s.get_mem_info()
print("ready", flush=True)
sys.stdin.readline()
n, end = 0, time.perf_counter() + seconds
while time.perf_counter() < end:
    s.get_mem_info(); n += 1
print(n, flush=True)
s.close()
"""


@contextlib.contextmanager
def raw_link(kind: str, path: str) -> Iterator[Callable[[], None]]:
    proc = subprocess.Popen([sys.executable, "-c", ECHO, kind, path], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        where = proc.stdout.readline().strip()
        if kind == "unix":
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(where)
        else:
            sock = socket.create_connection(("127.0.0.1", int(where)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        req = b"y" * REQUEST

        def once() -> None:
            sock.sendall(req)
            got = 0
            while got < REPLY:
                got += len(sock.recv(65536))

        yield once
        sock.close()
    finally:
        proc.wait(10)
        if kind == "unix":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def block(fn: Callable[[], object], n: int) -> list[float]:
    for _ in range(n // 10):  # warm the block (dropped)
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def latency(args: argparse.Namespace, work: Path) -> None:
    rows: dict[str, list[float]] = {}
    with (
        raw_link("unix", str(work / "echo.sock")) as raw_unix,
        raw_link("tcp", "") as raw_tcp,
        aclserver_harness.running_aclserver(
            work, shares=[aclserver_harness.share(0)], ledger_dir=str(work / "ledger")
        ) as srv,
        Session.open(srv.conf(), prefer="unix") as su,
        Session.open(srv.conf(), prefer="tcp") as st,
    ):
        for s in (su, st):
            s.init()
            s.set_device(0)
        paths: list[tuple[str, Callable[[], object]]] = [
            ("raw unix ping-pong", raw_unix),
            ("get_mem_info over unix", su.get_mem_info),
            ("raw tcp ping-pong", raw_tcp),
            ("get_mem_info over tcp", st.get_mem_info),
        ]
        for r in range(args.rounds):
            for name, fn in paths[r % len(paths) :] + paths[: r % len(paths)]:
                rows.setdefault(name, []).extend(block(fn, args.block))
    print(
        f"round trips: {args.rounds} interleaved rounds x {args.block} calls per path,"
        f" request {REQUEST} B, reply {REPLY} B"
    )
    print(f"{'path':24} {'median us':>10} {'p99 us':>8} {'p50 vs raw':>11} {'p99 vs raw':>11}")
    for name, xs in rows.items():
        base = rows["raw tcp ping-pong" if "tcp" in name else "raw unix ping-pong"]
        print(
            f"{name:24} {med(xs) * 1e6:10.1f} {p99(xs) * 1e6:8.1f} {med(xs) / med(base):11.2f}"
            f" {p99(xs) / p99(base):11.2f}"
        )


def _run_workers(confs: list[Path], seconds: float) -> int:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(c), str(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for c in confs
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        total = 0
        for p in procs:
            assert p.stdout is not None
            total += int(p.stdout.readline())
        return total
    finally:
        for p in procs:
            p.wait(30)


def throughput(args: argparse.Namespace, work: Path) -> None:
    top = max(args.counts)
    with contextlib.ExitStack() as stack:
        servers: list[RunningAclServer] = []
        for i in range(top):
            d = work / f"t{i}"
            d.mkdir()
            servers.append(
                stack.enter_context(
                    aclserver_harness.running_aclserver(
                        d,
                        shares=[aclserver_harness.share(0, die=0, compute=1)],
                        ledger_dir=str(work / "ledger"),
                        staging_bytes=1 << 20,
                    )
                )
            )
        confs = []
        for i, srv in enumerate(servers):
            path = work / f"t{i}.conf"
            path.write_text(clientconf.render(srv.conf()))
            confs.append(path)
        results: dict[str, list[float]] = {}
        for r in range(args.rounds):
            order = args.counts if r % 2 == 0 else list(reversed(args.counts))
            for n in order:
                ops = _run_workers(confs[:n], args.seconds)
                results.setdefault(f"{n} tenants (claims)", []).append(ops / args.seconds)
                ops = _run_workers([confs[0]] * n, args.seconds)
                results.setdefault(f"{n} sessions of one claim", []).append(ops / args.seconds)
    print(f"small-call throughput on one die, {args.rounds} interleaved rounds of {args.seconds:.1f} s")
    print(f"{'clients':26} {'median ops/s':>13} {'min':>9} {'max':>9}")
    for name, xs in results.items():
        print(f"{name:26} {med(xs):13.0f} {min(xs):9.0f} {max(xs):9.0f}")
    lo, hi = min(args.counts), max(args.counts)
    for kind in ("tenants (claims)", "sessions of one claim"):
        ratio = med(results[f"{hi} {kind}"]) / med(results[f"{lo} {kind}"])
        print(f"{hi} vs {lo} {kind}: {ratio:.2f}x (target >= 0.9x)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=500)
    parser.add_argument("--throughput", action="store_true", help="tenants/sessions throughput mode")
    parser.add_argument("--counts", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    with workdir() as work:
        if args.throughput:
            throughput(args, work)
        else:
            latency(args, work)


if __name__ == "__main__":
    main()
