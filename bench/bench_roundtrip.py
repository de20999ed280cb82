"""Control-link latency: a get_mem_info round trip through the aclserver, against a raw
socket ping-pong of the same frame sizes with a Python echo process, both in the same run
(target <= 3x over the unix socket; TCP reported too).

Usage: ``.venv/bin/python bench/bench_roundtrip.py [--n 5000]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

from _aclbench import med, p99, workdir

from dra_driver.aclserver import protocol
from dra_driver.aclserver.codes import MemAttr
from dra_driver.aclserver.protocol import Op
from dra_driver.client import Session
from dra_driver.testing import aclservers

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


def raw_pingpong(kind: str, n: int, path: str) -> list[float]:
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
        out = []
        for _ in range(n):
            t = time.perf_counter()
            sock.sendall(req)
            got = 0
            while got < REPLY:
                got += len(sock.recv(65536))
            out.append(time.perf_counter() - t)
        sock.close()
        return out[n // 10 :]
    finally:
        proc.wait(10)
        if kind == "unix":
            os.unlink(path)


def acl_roundtrips(session: Session, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        session.get_mem_info()
        out.append(time.perf_counter() - t)
    return out[n // 10 :]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=5000)
    args = parser.parse_args()
    with workdir() as work:
        rows = {
            "raw unix ping-pong": raw_pingpong("unix", args.n, str(work / "echo.sock")),
            "raw tcp ping-pong": raw_pingpong("tcp", args.n, ""),
        }
        with aclservers.running_aclserver(
            work, shares=[aclservers.share(0)], ledger_dir=str(work / "ledger")
        ) as srv:
            for kind in ("unix", "tcp"):
                with Session.open(srv.conf(), prefer=kind) as s:
                    assert s.transport_kind == kind
                    s.init()
                    s.set_device(0)
                    rows[f"get_mem_info over {kind}"] = acl_roundtrips(s, args.n)
    print(f"round trips, n={args.n} (first 10% dropped), request {REQUEST} B, reply {REPLY} B")
    print(f"{'path':24} {'median us':>10} {'p99 us':>8} {'vs raw':>7}")
    for name, xs in rows.items():
        base = rows["raw tcp ping-pong" if "tcp" in name else "raw unix ping-pong"]
        print(f"{name:24} {med(xs) * 1e6:10.1f} {p99(xs) * 1e6:8.1f} {med(xs) / med(base):7.2f}")


if __name__ == "__main__":
    main()
