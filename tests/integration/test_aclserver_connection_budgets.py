"""One pod's connections cannot keep another claim's tenant out (issue 25 class 1).

Real aclserver processes, real sockets. The attacker is another pod on the control-link bridge:
here a second loopback address (127.0.0.2), so the server sees it as a different peer from the
tenant's own TCP client (127.0.0.1). The adversarial round held 64 tokenless TCP connections to
claim B's aclserver, re-opened every 10 s, and B's tenant opened 0 of its sessions, even over its
unix socket; the server also listened on TCP for a ``transport: unix`` claim and its pre-auth
PING told any pod its host PID.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexnpu_client import Session
from flexnpu_testing import aclserver_harness
from flexnpu_testing.aclserver_harness import RunningAclServer
from flexnpu_wire import codes
from flexnpu_wire import framing as protocol
from flexnpu_wire.framing import Op

MEM = 64 << 20
ATTACKER = "127.0.0.2"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningAclServer]:
    with aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, die=5, memory=MEM)], ledger_dir=str(tmp_path / "l"),
        auth_timeout_ms=60_000,  # the attacker's connections stay for the whole test
    ) as srv:  # fmt: skip
        yield srv


def _flood(server: RunningAclServer, n: int) -> list[socket.socket]:
    """``n`` tokenless TCP connections from the attacker's address; the ones still open."""
    out = []
    for _ in range(n):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((ATTACKER, 0))
        sock.settimeout(5)
        sock.connect((server.ready.tcp_host, server.ready.tcp_port))
        out.append(sock)
    return out


def _open(sock: socket.socket) -> bool:
    """True while the server keeps ``sock`` (it answers a PING), False once it closed or refused it."""
    try:
        sock.sendall(protocol.encode(Op.PING, 5))
        reply = protocol.FrameReader(sock, 1 << 16).read()
    except OSError:
        return False
    return reply is not None and reply.op == Op.PING


def test_a_flood_of_tokenless_connections_keeps_no_session_out(server: RunningAclServer) -> None:
    spec = server.spec
    flood = _flood(server, 64)
    try:
        held = [s for s in flood if _open(s)]
        assert len(held) == 8, "one peer holds a few unauthenticated connections, not the budget"
        flood += _flood(server, 64)  # re-opened, as the attacker did every 10 s
        assert sum(_open(s) for s in flood) <= 8
        sessions = []
        with contextlib.ExitStack() as stack:
            for i in range(spec.max_sessions):  # every session the claim may have, unix and TCP
                conf = server.conf(tcp=i % 2 == 0, unix=i % 2 == 1)
                s = stack.enter_context(Session.open(conf, prefer="unix" if i % 2 else "tcp"))
                s.init()
                s.set_device(0)
                sessions.append(s)
            assert {s.transport_kind for s in sessions} == {"unix", "tcp"}
            ptr = sessions[0].malloc(4096)
            sessions[0].free(ptr)
        assert server.proc.poll() is None
    finally:
        for sock in flood:
            sock.close()


def test_a_new_peer_gets_in_when_the_tcp_budget_is_full(tmp_path: Path) -> None:
    with aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, die=6, memory=MEM)], ledger_dir=str(tmp_path / "l"),
        max_sessions=2, max_connections=6, auth_timeout_ms=60_000,
    ) as server:  # fmt: skip
        socks = []
        try:
            for address in (
                "127.0.0.2",
                "127.0.0.3",
                "127.0.0.4",
            ):  # 3 peers, 2 each: the budget of 4 is full
                for _ in range(2):
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    sock.bind((address, 0))
                    sock.settimeout(5)
                    sock.connect((server.ready.tcp_host, server.ready.tcp_port))
                    socks.append(sock)
            assert sum(_open(s) for s in socks) == 4
            with Session.open(server.conf(unix=False), prefer="tcp") as s:  # a new peer: 127.0.0.1
                s.init()
                s.set_device(0)
        finally:
            for sock in socks:
                sock.close()


def test_a_unix_only_claim_has_no_tcp_listener(tmp_path: Path) -> None:
    with aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, die=7, memory=MEM)], ledger_dir=str(tmp_path / "l"),
        tcp_listen=False,
    ) as server:  # fmt: skip
        assert server.ready.tcp_port == 0
        assert aclserver_harness.tcp_listeners(server.proc.pid) == [], "the aclserver holds no TCP listener"
        with Session.open(server.conf()) as s:
            assert s.transport_kind == "unix"
            s.init()
            s.set_device(0)


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_the_pre_auth_ping_names_no_process_on_tcp(server: RunningAclServer, kind: str) -> None:
    if kind == "tcp":
        sock = socket.create_connection((server.ready.tcp_host, server.ready.tcp_port), timeout=5)
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5)
        sock.connect(server.spec.unix_socket)
    with sock:
        sock.sendall(protocol.encode(Op.PING, 11))
        reply = protocol.FrameReader(sock, 1 << 16).read()
    assert reply is not None and reply.ints[0] == codes.ACL_SUCCESS and reply.tail == b"PONG"
    # over TCP any pod on the bridge may ask; over unix only the claim's own pods and the daemon
    assert reply.ints[1] == (0 if kind == "tcp" else server.proc.pid)


def test_refused_peers_are_told_why(server: RunningAclServer) -> None:
    flood = _flood(server, 9)
    try:
        reply = protocol.FrameReader(flood[-1], 1 << 16).read()  # the ninth, unasked
        assert reply is not None and reply.op == Op.NONE
        assert reply.ints[0] == codes.ACL_ERROR_RT_RESOURCE_ALLOC_FAIL
        assert b"too many connections from 127.0.0.2" in reply.tail and b"per peer" in reply.tail
        assert all(_open(s) for s in flood[:8])
    finally:
        for sock in flood:
            sock.close()
