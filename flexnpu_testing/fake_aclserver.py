"""Test double of the aclserver LAUNCH CONTRACT only (used to exercise failure modes).

``fake_aclserver.py --spec FILE [--fail] [--with-child]``: binds the spec's unix socket and TCP
port, writes the ready file atomically, answers PING with PONG (pid), exits 0 on SIGTERM.
``--fail`` writes to stderr and exits 3 before becoming ready; ``--with-child`` also starts a
sleeping child in its process group (to prove the daemon stops the whole group).
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
import time

from flexnpu_wire import framing as protocol


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--with-child", action="store_true")
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


if __name__ == "__main__":
    sys.exit(main())
