"""A tenant's socket cannot stall the daemon's API (issue 25, class 4).

Root in a container can replace its aclserver's socket in the claim's shm dir (the container mounts
that dir) with one that answers a byte at a time. Nine ``List(probe=True)`` calls (what metrics
scrapes and ``flexnpu-smi info`` do) used to tie up all eight daemon workers on it: Health timed out
and another claim's prepare failed at the kubelet's deadline. Here the real daemon, real aclservers,
and the tenant's socket a thread of this process (another pid than the aclserver's) serves.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dra_driver.daemon_api.values import EntityInfo, EntityState
from flexnpu_runtime.daemon import aclserver_ping
from flexnpu_wire import framing as protocol
from tests.integration.conftest import MakeDaemon
from tests.integration.daemon_harness import DaemonProc, ping_unix, request, share, wait_for


def in_flight(pinger: aclserver_ping.Pinger) -> int:
    """PINGs the pinger still runs (its own table, read under its lock)."""
    with pinger._lock:
        return len(pinger._inflight)


TRICKLE_GAP = 0.5
"""Seconds between two bytes of the tenant's answer: a 29-byte PONG takes ~15 s."""


@dataclass
class TrickleSocket:
    """A unix socket that answers every PING with a well-formed PONG, one byte per ``TRICKLE_GAP``."""

    path: Path
    pid: int
    accepted: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    _sock: socket.socket | None = None

    def start(self) -> TrickleSocket:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.path))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self) -> None:
        assert self._sock is not None
        while not self.stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            try:
                msg = protocol.FrameReader(conn, 4096).read()
                if msg is None:
                    return
                reply = protocol.encode_reply(protocol.Op.PING, msg.request_id, 0, self.pid)
                for i in range(len(reply)):
                    if self.stop.wait(TRICKLE_GAP):
                        return
                    conn.sendall(reply[i : i + 1])
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        if self._sock is not None:
            self._sock.close()


@pytest.fixture
def daemon(make_daemon: MakeDaemon) -> DaemonProc:
    return make_daemon()


@pytest.fixture
def tenant_socket(daemon: DaemonProc) -> Iterator[tuple[str, int, TrickleSocket]]:
    """Claim A registered, its socket replaced by the tenant's trickling one (which names A's pid)."""
    claim = str(uuid.uuid4())
    with daemon.client() as c:
        res = c.register(request(claim, share(0, vid=0, compute=20)))
    path = Path(res.endpoints.unix_socket)
    os.unlink(path)  # what root in the container can do in its shm dir
    fake = TrickleSocket(path, res.pid).start()
    try:
        yield claim, res.pid, fake
    finally:
        fake.close()


def test_nine_probing_lists_leave_health_and_another_prepare_fast(
    daemon: DaemonProc, tenant_socket: tuple[str, int, TrickleSocket]
) -> None:
    claim, pid, fake = tenant_socket
    with ThreadPoolExecutor(max_workers=9) as pool:
        lists = [pool.submit(probing_list, daemon) for _ in range(9)]
        wait_for(
            lambda: fake.accepted >= 1 or all(f.done() for f in lists), what="a List reaching the socket"
        )
        # While nine probing Lists run: Health and another claim's register answer within a
        # deadline far below the kubelet's 45 s (with the old PING: ~15 s per List, 8 workers held).
        with daemon.client(timeout=5.0) as quick:
            assert quick.health().ok
            other = str(uuid.uuid4())
            res = quick.register(request(other, share(1, vid=0, compute=20)))
            assert ping_unix(res.endpoints.unix_socket) == res.pid
        results = [f.result(timeout=60) for f in lists]
    for infos in results:
        (mine,) = [i for i in infos if i.entity_id == claim]
        assert (mine.state, mine.pid) == (EntityState.UNKNOWN, pid)
        assert f"held by pid {os.getpid()}, not by the aclserver (pid {pid})" in mine.message


def probing_list(daemon: DaemonProc) -> list[EntityInfo]:
    with daemon.client(timeout=60) as c:
        return c.list(probe=True)


def test_a_socket_that_trickles_is_given_one_deadline(tmp_path: Path) -> None:
    """Even the right peer (here: this process) is given one absolute deadline, not one per byte."""
    fake = TrickleSocket(tmp_path / "aclserver.sock", os.getpid()).start()
    try:
        answer = aclserver_ping.ping(str(fake.path), expect_pid=os.getpid(), timeout=1.0)
    finally:
        fake.close()
    assert answer.pid is None and "no answer within 1 s" in answer.reason, answer


def test_concurrent_probes_share_one_ping_per_claim(tmp_path: Path) -> None:
    fake = TrickleSocket(tmp_path / "aclserver.sock", os.getpid()).start()
    pinger = aclserver_ping.Pinger(timeout=1.0)
    try:
        with ThreadPoolExecutor(max_workers=9) as pool:
            rounds = list(pool.map(lambda _: pinger.ping_all({"a": (str(fake.path), os.getpid())}), range(9)))
        wait_for(lambda: in_flight(pinger) == 0, what="the one PING ended at its deadline")
    finally:
        fake.close()
    assert all(r["a"].pid is None for r in rounds)
    assert fake.accepted < len(rounds), f"{fake.accepted} PINGs for {len(rounds)} callers"
