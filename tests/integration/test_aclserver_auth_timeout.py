"""An aclserver closes connections that do not authenticate in time; authenticated clients may idle."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexnpu_client.session import Session
from flexnpu_testing import aclserver_harness
from flexnpu_testing.aclserver_harness import RunningAclServer
from flexnpu_wire import framing as protocol

AUTH_TIMEOUT_MS = 300


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningAclServer]:
    with aclserver_harness.running_aclserver(
        tmp_path,
        shares=[aclserver_harness.share(0, die=5)],
        ledger_dir=str(tmp_path / "ledger"),
        auth_timeout_ms=AUTH_TIMEOUT_MS,
    ) as srv:
        yield srv


def _closed_by_server(sock: socket.socket) -> float:
    """Block until the server closes ``sock``; how long that took."""
    t0 = time.monotonic()
    sock.settimeout(30)
    assert sock.recv(1) == b""  # EOF: the server hung up
    return time.monotonic() - t0


@pytest.mark.parametrize("family", ["unix", "tcp"])
def test_silent_connection_is_closed_but_an_authenticated_one_stays(
    server: RunningAclServer, family: str
) -> None:
    with Session.open(server.conf()) as session:  # authenticated before the silent peer arrives
        session.init()
        session.set_device(0)
        if family == "unix":
            silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            silent.connect(server.spec.unix_socket)
        else:
            silent = socket.create_connection((server.ready.tcp_host, server.ready.tcp_port))
        with silent:
            waited = _closed_by_server(silent)
        assert waited >= AUTH_TIMEOUT_MS / 1000 * 0.9
        # the authenticated session idled at least as long, and still works
        free, total = session.get_mem_info()
        assert total == server.spec.shares[0].memory_bytes and free == total


def test_ping_needs_no_authentication_within_the_window(server: RunningAclServer) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(server.spec.unix_socket)
        s.sendall(protocol.encode(protocol.Op.PING, 3))
        msg = protocol.FrameReader(s, 1 << 20).read()
        assert msg is not None and msg.op == protocol.Op.PING and msg.ints[0] == 0
        _closed_by_server(s)  # and it is closed after the window, like any unauthenticated peer
