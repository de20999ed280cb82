"""Test double of the aclserver LAUNCH CONTRACT only (used to exercise failure modes).

``fake_aclserver.py --spec FILE [--fail] [--with-child] [--leak-if DIR]``: binds the spec's unix
socket and TCP port, writes the ready file atomically, answers PING with PONG (pid), exits 0 on
SIGTERM. ``--fail`` writes to stderr and exits 3 before becoming ready; ``--with-child`` also
starts a sleeping child in its process group (to prove the daemon stops the whole group);
``--leak-if DIR``: when ``DIR/<claim uid>`` exists, once ready it allocates and touches memory
without end, as a leaking aclserver would (to prove its cgroup's memory bound stops it alone).
``--threads-if DIR``: when ``DIR/<claim uid>`` exists, once ready it starts threads that wait, as
sessions opening on every vNPU do, until one cannot start, and dies of it as a Python process does
("can't start new thread"; to prove the daemon records its task bound as the reason).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

from flexnpu_wire import framing as protocol


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--with-child", action="store_true")
    parser.add_argument("--leak-if", default="")
    parser.add_argument("--threads-if", default="")
    args = parser.parse_args()
    with open(args.spec) as fh:
        spec = json.load(fh)
    if args.fail:
        print(f"fake aclserver: refusing to start for claim {spec['claim_uid']}", file=sys.stderr)
        return 3
    if args.with_child:
        subprocess.Popen(["sleep", "1000"], stdin=subprocess.DEVNULL)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(spec["unix_socket"]):
        os.unlink(spec["unix_socket"])
    unix.bind(spec["unix_socket"])
    unix.listen(16)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind((spec["tcp_host"], spec["tcp_port"]))
    tcp.listen(16)

    def on_term(signum: int, frame: object) -> None:
        os.unlink(spec["unix_socket"])
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    ready = {
        "pid": os.getpid(),
        "tcp_host": spec["tcp_host"],
        "tcp_port": tcp.getsockname()[1],
        "unix_socket": spec["unix_socket"],
        "started_at": time.time(),
    }
    tmp = spec["ready_file"] + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(ready, fh)
    os.replace(tmp, spec["ready_file"])
    if args.leak_if and os.path.exists(os.path.join(args.leak_if, spec["claim_uid"])):
        _leak()
    if args.threads_if and os.path.exists(os.path.join(args.threads_if, spec["claim_uid"])):
        _threads()
    sel = selectors.DefaultSelector()
    sel.register(unix, selectors.EVENT_READ, None)
    sel.register(tcp, selectors.EVENT_READ, None)
    while True:
        for key, _ in sel.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if key.data is None:
                conn, _ = sock.accept()
                sel.register(conn, selectors.EVENT_READ, protocol.FrameReader(conn, 1 << 20))
                continue
            try:
                msg = key.data.read()
            except (OSError, protocol.ProtocolError):
                msg = None
            if msg is None:
                sel.unregister(sock)
                sock.close()
                continue
            if msg.op == protocol.Op.PING:
                sock.sendall(protocol.encode_reply(msg.op, msg.request_id, 0, os.getpid()))


def _leak() -> None:
    """Allocate and touch 4 MiB after 4 MiB until the kernel stops this process."""
    held = []
    while True:
        chunk = bytearray(4 << 20)
        for i in range(0, len(chunk), 4096):
            chunk[i] = 1
        held.append(chunk)


def _threads() -> None:
    """Start waiting threads until the kernel refuses one (the RuntimeError ends the process)."""
    hold = threading.Event()
    while True:
        threading.Thread(target=hold.wait, daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
