"""A hostile container against its own aclserver, while another claim's client keeps working.

Real aclserver processes: slow authentication (PINGs do not extend the deadline), large
pre-authentication frames, connection floods under the connection cap and under a low fd limit
(EMFILE), and a truncated staging file (an error for that copy, never a SIGBUS).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from flexnpu_client import AclError, Session
from flexnpu_testing import aclserver_harness
from flexnpu_testing.aclserver_harness import RunningAclServer
from flexnpu_testing.waiting import wait_for
from flexnpu_wire import codes
from flexnpu_wire import datalink as wire_datalink
from flexnpu_wire import framing as protocol
from flexnpu_wire.codes import MemcpyKind
from flexnpu_wire.framing import Op

MEM = 64 << 20


@pytest.fixture
def bystander(tmp_path: Path) -> Iterator[Session]:
    """Another claim's aclserver and an authenticated client of it: it must never notice."""
    work = tmp_path / "bystander"
    work.mkdir()
    with aclserver_harness.running_aclserver(
        work, shares=[aclserver_harness.share(0, die=3, memory=MEM)], ledger_dir=str(tmp_path / "ledger")
    ) as srv:
        with Session.open(srv.conf()) as s:
            s.init()
            s.set_device(0)
            yield s


def _victim(tmp_path: Path, **spec_args: object) -> AbstractContextManager[RunningAclServer]:
    work = tmp_path / "victim"
    work.mkdir(exist_ok=True)
    return aclserver_harness.running_aclserver(
        work,
        shares=[aclserver_harness.share(0, die=4, memory=MEM)],
        ledger_dir=str(tmp_path / "ledger"),
        **spec_args,  # type: ignore[arg-type]
    )


def _works(s: Session) -> None:
    ptr = s.malloc(1 << 20)
    s.copy_to_device(ptr, b"ok" * 512)
    assert s.copy_from_device(ptr, 1024) == b"ok" * 512
    s.free(ptr)


def _unix(server: RunningAclServer) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(server.spec.unix_socket)
    return sock


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True
    except BlockingIOError:
        return False


def test_pinging_peer_is_closed_at_the_absolute_auth_deadline(tmp_path: Path, bystander: Session) -> None:
    with _victim(tmp_path, auth_timeout_ms=400) as victim:
        sock = _unix(victim)
        sock.settimeout(5)
        rid = 0

        def ping_until_closed() -> bool:
            nonlocal rid
            rid += 1
            try:
                sock.sendall(protocol.encode(Op.PING, rid))
                data = sock.recv(65536)
            except (BrokenPipeError, ConnectionResetError):
                return True
            return data == b""

        # the old idle timeout never fired for a peer that keeps pinging
        wait_for(ping_until_closed, timeout=30, interval=0.05, what="the pinging peer closed")
        sock.close()
        with Session.open(victim.conf()) as s:  # an honest client still gets in
            s.init()
            s.set_device(0)
            _works(s)
    _works(bystander)


def test_large_pre_auth_frames_are_refused_without_allocating(tmp_path: Path, bystander: Session) -> None:
    with _victim(tmp_path, max_connections=256) as victim:
        rss_before = _rss(victim.proc.pid)
        socks = []
        for _ in range(120):
            sock = _unix(victim)
            sock.sendall(struct.pack(">I", 64 << 20) + b"\0" * 9)  # announces a 64 MiB frame
            socks.append(sock)
        for sock in socks:
            sock.settimeout(10)
            reader = protocol.FrameReader(sock, 1 << 16)
            reply = reader.read()
            assert reply is not None and reply.op == Op.NONE
            assert reply.ints[0] == codes.ACL_ERROR_INVALID_PARAM and b"exceeds" in reply.tail
            assert _closed(sock)
            sock.close()
        assert _rss(victim.proc.pid) - rss_before < 16 << 20
        assert victim.proc.poll() is None
    _works(bystander)


def test_connection_cap_refuses_extra_connections_and_keeps_the_session(
    tmp_path: Path, bystander: Session
) -> None:
    with _victim(tmp_path, max_sessions=2, max_connections=6) as victim:
        with Session.open(victim.conf()) as s:
            s.init()
            s.set_device(0)
            flood = [_unix(victim) for _ in range(30)]
            refused = 0
            for sock in flood:
                sock.settimeout(10)
                with contextlib.suppress(OSError):  # a refused one is closed already; its reply waits
                    sock.sendall(protocol.encode(Op.PING, 1))
                reply = protocol.FrameReader(sock, 1 << 16).read()
                if reply is not None and reply.op == Op.NONE:
                    assert reply.ints[0] == codes.ACL_ERROR_RT_RESOURCE_ALLOC_FAIL
                    assert b"too many connections" in reply.tail
                    refused += 1
            assert refused >= 30 - 5  # the session holds one of the six
            _works(s)
            for sock in flood:
                sock.close()
            # after the flood, new connections are accepted again
            wait_for(lambda: _ping_ok(victim), timeout=10, what="accepting again")
    _works(bystander)


def test_fd_exhaustion_is_survived(tmp_path: Path, bystander: Session) -> None:
    # the hard limit caps what the aclserver can raise its soft limit to; the cap is above it
    with _victim(tmp_path, max_connections=4096, nofile_limit=48) as victim:
        with Session.open(victim.conf()) as s:
            s.init()
            s.set_device(0)
            flood = []
            for _ in range(200):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(2)  # once the backlog is full, connect blocks: stop there
                try:
                    sock.connect(victim.spec.unix_socket)
                except OSError:
                    sock.close()
                    break
                flood.append(sock)
            assert len(flood) > 48  # more than the aclserver can hold: accept() met EMFILE
            _works(s)  # the authenticated session is served while accept() fails with EMFILE
            assert victim.proc.poll() is None
            for sock in flood:
                sock.close()
            wait_for(lambda: _ping_ok(victim), timeout=15, what="accepting again after EMFILE")
            _works(s)
        stderr = victim.stderr_path.read_text()
        assert "accept failed" in stderr
    _works(bystander)


def test_truncated_staging_file_fails_the_copy_not_the_server(tmp_path: Path, bystander: Session) -> None:
    """On TCP the data link is region files the server reads with pread: truncating one fails the copy."""
    with _victim(tmp_path, staging_bytes=1 << 20) as victim:
        with Session.open(victim.conf(unix=False)) as s, Session.open(victim.conf(unix=False)) as other:
            s.init()
            s.set_device(0)
            other.init()
            other.set_device(0)
            ptr = s.malloc(4 << 20)
            staging = [
                f for f in os.listdir(victim.spec.shm_dir) if f.startswith(f"staging-{victim.proc.pid}-")
            ]
            for name in staging:  # a hostile container truncates every staging file it can see
                os.truncate(os.path.join(victim.spec.shm_dir, name), 0)
            # the copy is sent as frames only: the client's own mapping of a truncated file would
            # SIGBUS the client, which is the container hurting itself, not the aclserver
            with pytest.raises(AclError) as err:
                s.call(
                    Op.MEMCPY, ptr, 4 << 20, wire_datalink.host_ptr(0, 0), 1 << 19, MemcpyKind.HOST_TO_DEVICE
                )
            assert err.value.ret == codes.ACL_ERROR_INVALID_PARAM and "data link" in err.value.message
            assert victim.proc.poll() is None
            s.free(ptr)
            assert s.get_mem_info() == (MEM, MEM)
        with Session.open(victim.conf()) as fresh:  # a new session gets a fresh staging region
            fresh.init()
            fresh.set_device(0)
            _works(fresh)
    _works(bystander)


def _ping_ok(server: RunningAclServer) -> bool:
    try:
        with _unix(server) as sock:
            sock.settimeout(5)
            sock.sendall(protocol.encode(Op.PING, 9))
            reply = protocol.FrameReader(sock, 1 << 16).read()
            return reply is not None and reply.op == Op.PING and reply.ints[0] == 0
    except OSError:
        return False


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _staging_fd(sock: socket.socket, server: RunningAclServer) -> tuple[int, int]:
    """HELLO and STAGING_FD on a raw unix connection: (the sealed staging memfd, its size)."""
    import array

    sock.sendall(
        protocol.encode(Op.HELLO, 1, (protocol.PROTOCOL_VERSION, os.getpid()), server.spec.token.encode())
    )
    reader = protocol.FrameReader(sock, 1 << 20)
    hello = reader.read()
    assert hello is not None and hello.ints[0] == 0
    sock.sendall(protocol.encode(Op.STAGING_FD, 2))
    buf = bytearray(256)
    got, anc, _flags, _addr = sock.recvmsg_into([buf], socket.CMSG_SPACE(4))
    (reply,) = [protocol.decode(buf, 4, got - 4)]
    assert reply.ints[0] == 0, reply
    fds = array.array("i")
    fds.frombytes(anc[0][2])
    return fds[0], reply.ints[1]


def test_a_sealed_staging_memfd_cannot_be_shrunk_and_a_punched_hole_harms_nobody(
    tmp_path: Path, bystander: Session
) -> None:
    """On the unix socket the staging region is a memfd the server maps: the client cannot shrink
    or grow it (sealed), and a hole it punches reads back as zeros — never a SIGBUS."""
    import ctypes
    import fcntl

    with _victim(tmp_path, staging_bytes=1 << 20) as victim, _unix(victim) as sock:
        fd, size = _staging_fd(sock, victim)
        try:
            assert size == 1 << 20
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW and seals & fcntl.F_SEAL_SEAL
            for length in (0, size // 2, size * 2):
                with pytest.raises(PermissionError):
                    os.ftruncate(fd, length)
            with pytest.raises(PermissionError):
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, 0)  # F_SEAL_SEAL: no seal can change
            libc = ctypes.CDLL(None, use_errno=True)
            punch_hole_keep_size = 0x02 | 0x01
            assert libc.fallocate(fd, punch_hole_keep_size, ctypes.c_long(0), ctypes.c_long(size)) == 0
            # the aclserver copies out of the punched staging region: zeros, and it keeps serving
            for rid, op, ints in (
                (3, Op.INIT, ()), (4, Op.SET_DEVICE, (0,)), (5, Op.MALLOC, (4096, 0)),
            ):  # fmt: skip
                sock.sendall(protocol.encode(op, rid, ints))
            reader = protocol.FrameReader(sock, 1 << 20)
            replies = [reader.read() for _ in range(3)]
            assert all(r is not None and r.ints[0] == 0 for r in replies), replies
            ptr = replies[2].ints[1]  # type: ignore[union-attr]
            sock.sendall(
                protocol.encode(
                    Op.MEMCPY, 6, (ptr, 4096, wire_datalink.host_ptr(0, 0), 4096, MemcpyKind.HOST_TO_DEVICE)
                )
            )
            copy = reader.read()
            assert copy is not None and copy.ints[0] == 0
            assert victim.proc.poll() is None
        finally:
            os.close(fd)
    _works(bystander)
