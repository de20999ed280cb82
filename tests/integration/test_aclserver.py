"""The aclserver as a real process: every op, authentication, framing errors, bad inputs.

One aclserver (two vNPUs) is shared by this module; every test opens its own connection, and a
connection's end releases everything it held, which several tests check.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from flexnpu_client import AclError, ConnectError, Session
from flexnpu_testing import aclserver_harness
from flexnpu_testing.aclserver_harness import RunningAclServer
from flexnpu_wire import clientconf, codes
from flexnpu_wire import datalink as wire_datalink
from flexnpu_wire import framing as protocol
from flexnpu_wire.clientconf import Endpoints
from flexnpu_wire.codes import MemcpyKind
from flexnpu_wire.framing import Op

MEM0 = 1 << 20
MEM1 = 32 << 20
STAGING = 4 << 20
H2D, D2H, D2D = MemcpyKind.HOST_TO_DEVICE, MemcpyKind.DEVICE_TO_HOST, MemcpyKind.DEVICE_TO_DEVICE


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAclServer]:
    work = tmp_path_factory.mktemp("aclserver")
    shares = [
        aclserver_harness.share(0, die=0, memory=MEM0, compute=50),
        aclserver_harness.share(1, die=1, memory=MEM1),
    ]
    with aclserver_harness.running_aclserver(
        work, shares=shares, ledger_dir=str(work / "ledger"), max_frame_bytes=8192, staging_bytes=STAGING
    ) as srv:
        yield srv


@pytest.fixture
def session(server: RunningAclServer) -> Iterator[Session]:
    with Session.open(server.conf()) as s:
        s.init()
        s.set_device(0)
        yield s


def raw_connect(server: RunningAclServer, kind: str = "unix") -> socket.socket:
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(server.spec.unix_socket)
    else:
        sock = socket.create_connection((server.ready.tcp_host, server.ready.tcp_port))
    sock.settimeout(10)
    return sock


def exchange(
    sock: socket.socket, op: int, ints: tuple[int, ...] = (), tail: bytes = b"", rid: int = 1
) -> protocol.Message:
    sock.sendall(protocol.encode(op, rid, ints, tail))
    msg = protocol.FrameReader(sock, 1 << 20).read()
    assert msg is not None
    return msg


def hello(sock: socket.socket, server: RunningAclServer) -> protocol.Message:
    return exchange(sock, Op.HELLO, (protocol.PROTOCOL_VERSION, os.getpid()), server.spec.token.encode())


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def new_session_sees_everything_released(server: RunningAclServer) -> None:
    with Session.open(server.conf()) as s:
        s.init()
        for device in (0, 1):
            s.set_device(device)
            free, total = s.get_mem_info()
            assert free == total


# -- liveness and authentication -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_ping_needs_no_token(server: RunningAclServer, kind: str) -> None:
    with raw_connect(server, kind) as sock:
        reply = exchange(sock, Op.PING, rid=77)
        # the pid only over unix (the claim's own pods and the daemon): over TCP any pod may ask
        pid = server.proc.pid if kind == "unix" else 0
        assert (reply.request_id, reply.ints, reply.tail) == (77, (0, pid), b"PONG")


@pytest.mark.parametrize(
    ("op", "tail"),
    [
        pytest.param(Op.HELLO, b"0" * 32, id="wrong-token"),
        pytest.param(Op.HELLO, b"", id="empty-token"),
        pytest.param(Op.INIT, b"", id="no-hello"),
    ],
)
def test_bad_or_missing_token_is_refused_and_closed(server: RunningAclServer, op: int, tail: bytes) -> None:
    with raw_connect(server) as sock:
        reply = exchange(sock, op, (protocol.PROTOCOL_VERSION, 1) if op == Op.HELLO else (), tail)
        assert reply.ints[0] == codes.ACL_ERROR_RT_NO_PERMISSION
        assert closed_by_peer(sock)
    with Session.open(server.conf()) as s:
        assert s.ping() == server.proc.pid


def test_client_with_wrong_token_gets_connect_error(server: RunningAclServer) -> None:
    conf = server.conf()
    bad = clientconf.ClientConf(conf.claim_uid, "ff" * 16, conf.endpoints, conf.shm_dir, conf.shares)
    with pytest.raises(ConnectError, match="invalid token"):
        Session.open(bad)


def test_tcp_fallback_when_unix_socket_unreachable(server: RunningAclServer) -> None:
    conf = server.conf()
    broken = clientconf.ClientConf(
        conf.claim_uid,
        conf.token,
        Endpoints(unix="/nonexistent/x.sock", tcp=conf.endpoints.tcp),
        conf.shm_dir,
        conf.shares,
    )
    with Session.open(broken) as s:
        assert s.transport_kind == "tcp"
        s.init()
        s.set_device(1)
        ptr = s.malloc(1000)
        s.copy_to_device(ptr, b"via tcp" * 100)
        assert s.copy_from_device(ptr, 7) == b"via tcp"
    with Session.open(server.conf()) as s:
        assert s.transport_kind == "unix"


# -- framing errors ----------------------------------------------------------------------------------


def test_unknown_op_keeps_the_connection(session: Session) -> None:
    reply = session.link.request(999)
    assert reply.ints[0] == codes.ACL_ERROR_INVALID_PARAM and b"unknown op 999" in reply.tail
    assert session.get_device_count() == 2


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(struct.pack(">I", 9000) + b"x" * 100, id="oversized"),
        pytest.param(struct.pack(">I", 3) + b"abc", id="shorter-than-header"),
        pytest.param(struct.pack(">IHHIB", 9, Op.INIT, 0, 5, 4), id="values-missing"),
        pytest.param(struct.pack(">I", 200) + b"x" * 20, id="eof-mid-frame"),
    ],
)
def test_bad_frames_get_an_error_and_close(server: RunningAclServer, raw: bytes) -> None:
    with raw_connect(server) as sock:
        assert hello(sock, server).ints[0] == 0
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        reply = protocol.FrameReader(sock, 1 << 20).read()
        assert reply is not None and reply.op == Op.NONE and reply.ints[0] == codes.ACL_ERROR_INVALID_PARAM
        assert reply.tail
        assert closed_by_peer(sock)
    new_session_sees_everything_released(server)


# -- lifecycle and devices ----------------------------------------------------------------------------


def test_init_state_machine(server: RunningAclServer) -> None:
    with Session.open(server.conf()) as s:
        with pytest.raises(AclError) as err:
            s.get_device_count()
        assert err.value.ret == codes.ACL_ERROR_UNINITIALIZE
        s.init()
        with pytest.raises(AclError) as err:
            s.init()
        assert err.value.ret == codes.ACL_ERROR_REPEAT_INITIALIZE
        s.set_device(0)
        ptr = s.malloc(4096)
        s.finalize()
        s.init()
        s.set_device(0)
        assert s.get_mem_info() == (MEM0, MEM0)
        with pytest.raises(AclError):
            s.free(ptr)


def test_devices(session: Session) -> None:
    assert session.get_device_count() == 2
    assert session.get_device() == 0
    session.set_device(1)
    assert session.get_device() == 1
    for bad in (2, -1):
        with pytest.raises(AclError) as err:
            session.set_device(bad)
        assert err.value.ret == codes.ACL_ERROR_INVALID_DEVICE


def test_malloc_needs_a_device(server: RunningAclServer) -> None:
    with Session.open(server.conf()) as s:
        s.init()
        with pytest.raises(AclError) as err:
            s.malloc(64)
        assert err.value.ret == codes.ACL_ERROR_INVALID_DEVICE


# -- memory ----------------------------------------------------------------------------------------------


def test_mem_info_total_is_the_quota_and_free_tracks_use(session: Session) -> None:
    assert session.get_mem_info() == (MEM0, MEM0)
    ptr = session.malloc(1000)
    assert session.get_mem_info() == (MEM0 - 1024, MEM0)  # 32-byte granularity
    session.set_device(1)
    assert session.get_mem_info(codes.MemAttr.DDR_MEM) == (MEM1, MEM1)
    session.free(ptr)
    session.set_device(0)
    assert session.get_mem_info() == (MEM0, MEM0)
    with pytest.raises(AclError) as err:
        session.get_mem_info(77)
    assert err.value.ret == codes.ACL_ERROR_INVALID_PARAM


@pytest.mark.parametrize(
    ("size", "policy", "ret"),
    [
        pytest.param(0, 0, codes.ACL_ERROR_INVALID_PARAM, id="zero"),
        pytest.param(-5, 0, codes.ACL_ERROR_INVALID_PARAM, id="negative"),
        pytest.param(64, 99, codes.ACL_ERROR_INVALID_PARAM, id="unknown-policy"),
        pytest.param(MEM0 + 1, 0, codes.ACL_ERROR_RT_MEMORY_ALLOCATION, id="over-quota"),
    ],
)
def test_bad_malloc_changes_nothing(session: Session, size: int, policy: int, ret: int) -> None:
    keep = session.malloc(MEM0 // 2)
    before = session.get_mem_info()
    with pytest.raises(AclError) as err:
        session.malloc(size, policy)
    assert err.value.ret == ret
    assert session.get_mem_info() == before
    session.free(keep)


def test_quota_is_exact(session: Session) -> None:
    ptrs = [session.malloc(MEM0 // 4) for _ in range(4)]
    assert session.get_mem_info() == (0, MEM0)
    with pytest.raises(AclError) as err:
        session.malloc(32)
    assert err.value.ret == codes.ACL_ERROR_RT_MEMORY_ALLOCATION
    session.free(ptrs[0])
    session.malloc(MEM0 // 4)


@pytest.mark.parametrize(
    "make_host",
    [
        pytest.param(lambda n: bytes(i % 251 for i in range(n)), id="bytes"),
        pytest.param(lambda n: bytearray(i % 253 for i in range(n)), id="bytearray"),
        pytest.param(lambda n: memoryview(bytes(i % 241 for i in range(n))), id="memoryview"),
        pytest.param(lambda n: np.arange(n // 4, dtype=np.uint32), id="numpy"),
    ],
)
def test_memcpy_round_trip_through_device(session: Session, make_host: object) -> None:
    session.set_device(1)
    host = make_host(9 << 20)  # type: ignore[operator]
    size = memoryview(host).nbytes
    a, b = session.malloc(size), session.malloc(size)
    session.memcpy(a, size, host, size, H2D)  # more than the 4 MiB staging region: chunked
    session.memcpy(b, size, a, size, D2D)
    out = np.zeros(size, dtype=np.uint8)
    session.memcpy(out, size, b, size, D2H)
    assert out.tobytes() == memoryview(host).tobytes()
    partial = bytearray(10)
    session.memcpy(partial, 10, b + 100, 10, D2H)
    assert bytes(partial) == memoryview(host).tobytes()[100:110]


def test_malloc_host_is_zero_copy_and_bounded(session: Session) -> None:
    hp = session.malloc_host(8192)
    view = session.host_view(hp)
    view[:5] = b"hello"
    dev = session.malloc(8192)
    session.memcpy(dev, 8192, hp, 8192, H2D)
    session.memcpy(hp + 100, 100, dev, 5, D2H)
    assert bytes(session.host_view(hp + 100, 5)) == b"hello"
    with pytest.raises(AclError) as err:
        session.memcpy(dev, 8192, hp + 8000, 1000, H2D)
    assert err.value.ret == codes.ACL_ERROR_INVALID_PARAM
    session.free_host(hp)
    with pytest.raises(AclError):
        session.memcpy(dev, 8192, hp, 10, H2D)


def test_memset(session: Session) -> None:
    ptr = session.malloc(64)
    session.memset(ptr, 64, 0xAB, 64)
    assert session.copy_from_device(ptr, 64) == b"\xab" * 64
    for args in ((ptr, 64, 0xAB, 65), (ptr, 64, 300, 4), (ptr + 60, 64, 1, 8)):
        with pytest.raises(AclError) as err:
            session.memset(*args)
        assert err.value.ret == codes.ACL_ERROR_INVALID_PARAM
    assert session.copy_from_device(ptr, 64) == b"\xab" * 64


FOREIGN = 0x7777_0000_0000


@pytest.mark.parametrize(
    ("call", "what"),
    [
        pytest.param(lambda s, p, h: s.free(FOREIGN), "free-foreign", id="free-foreign"),
        pytest.param(lambda s, p, h: s.free(p + 8), "free-interior", id="free-interior"),
        pytest.param(
            lambda s, p, h: s.memcpy(FOREIGN, 64, h, 64, H2D), "memcpy-foreign-dst", id="memcpy-foreign-dst"
        ),
        pytest.param(
            lambda s, p, h: s.memcpy(h, 64, FOREIGN, 64, D2H), "memcpy-foreign-src", id="memcpy-foreign-src"
        ),
        pytest.param(lambda s, p, h: s.memcpy(p, 4096, h, 65, H2D), "memcpy-past-end", id="memcpy-past-end"),
        pytest.param(
            lambda s, p, h: s.memcpy(p + 32, 64, h, 64, H2D),
            "memcpy-offset-past-end",
            id="memcpy-offset-past-end",
        ),
        pytest.param(
            lambda s, p, h: s.memcpy(p, 8, h, 64, H2D), "count-over-dst-max", id="count-over-dst-max"
        ),
        pytest.param(lambda s, p, h: s.memcpy(p, 64, h, 64, D2H), "kind-mismatch", id="kind-mismatch"),
        pytest.param(lambda s, p, h: s.memcpy(p, 64, h, 64, 42), "unknown-kind", id="unknown-kind"),
        pytest.param(lambda s, p, h: s.memcpy(p, 64, p, -1, D2D), "negative-count", id="negative-count"),
    ],
)
def test_bad_pointer_ops_change_nothing(session: Session, call: object, what: str) -> None:
    ptr = session.malloc(64)
    session.memset(ptr, 64, 7, 64)
    hp = session.malloc_host(4096)
    session.host_view(hp)[:64] = b"\x01" * 64
    before = session.get_mem_info()
    with pytest.raises(AclError) as err:
        call(session, ptr, hp)  # type: ignore[operator]
    assert err.value.ret == codes.ACL_ERROR_INVALID_PARAM, what
    assert session.get_mem_info() == before
    assert session.copy_from_device(ptr, 64) == b"\x07" * 64


def test_pointer_of_another_session_is_foreign(server: RunningAclServer) -> None:
    with Session.open(server.conf()) as s:
        s.init()
        s.set_device(0)
        old = s.malloc(64)
    with Session.open(server.conf()) as s:
        s.init()
        s.set_device(0)
        with pytest.raises(AclError) as err:
            s.free(old)
        assert err.value.ret == codes.ACL_ERROR_INVALID_PARAM


def test_disconnect_mid_copy_releases_memory_and_buffers(server: RunningAclServer) -> None:
    with raw_connect(server) as sock:
        reply = hello(sock, server)
        assert reply.ints[0] == 0
        staging = Path(server.spec.shm_dir) / reply.tail.decode()
        assert staging.exists()
        assert exchange(sock, Op.INIT).ints[0] == 0
        assert exchange(sock, Op.SET_DEVICE, (1,)).ints[0] == 0
        ptr = exchange(sock, Op.MALLOC, (MEM1, 0)).ints[1]
        # a copy request the client never waits for
        sock.sendall(protocol.encode(Op.MEMCPY, 9, (ptr, MEM1, wire_datalink.host_ptr(0), STAGING, H2D)))
    aclserver_harness.wait_for(lambda: not staging.exists(), what="staging region removed")
    new_session_sees_everything_released(server)
    assert sorted(os.listdir(server.spec.shm_dir)) == ["aclserver.sock"]


# -- streams and kernels ----------------------------------------------------------------------------


def test_kernel_runs_and_writes_its_result(session: Session) -> None:
    data = os.urandom(4096)
    inp, out = session.malloc(4096), session.malloc(16)
    session.copy_to_device(inp, data)
    stream = session.create_stream()
    session.launch_kernel(stream, 2000, tag=0xC0FFEE, out_ptr=out, in_ptr=inp, in_len=4096)
    session.launch_kernel(stream, 1000, tag=7)
    session.synchronize_stream(stream)
    assert struct.unpack("<QQ", session.copy_from_device(out, 16)) == (0xC0FFEE, zlib.crc32(data))
    kernels, die_us = session.stats()
    assert kernels == 2 and die_us >= 3000
    session.synchronize_device()
    session.destroy_stream(stream)
    with pytest.raises(AclError) as err:
        session.synchronize_stream(stream)
    assert err.value.ret == codes.ACL_ERROR_INVALID_RESOURCE_HANDLE


@pytest.mark.parametrize(
    ("args", "ret"),
    [
        pytest.param(
            {"stream": 12345, "duration_us": 10}, codes.ACL_ERROR_INVALID_RESOURCE_HANDLE, id="unknown-stream"
        ),
        pytest.param({"duration_us": 0}, codes.ACL_ERROR_INVALID_PARAM, id="zero-duration"),
        pytest.param({"duration_us": 10**9}, codes.ACL_ERROR_INVALID_PARAM, id="too-long"),
        pytest.param(
            {"duration_us": 10, "out_ptr": FOREIGN}, codes.ACL_ERROR_INVALID_PARAM, id="foreign-out"
        ),
        pytest.param(
            {"duration_us": 10, "in_ptr": FOREIGN, "in_len": 4},
            codes.ACL_ERROR_INVALID_PARAM,
            id="foreign-in",
        ),
    ],
)
def test_bad_kernel_launch(session: Session, args: dict[str, int], ret: int) -> None:
    stream = session.create_stream()
    args = {"stream": stream, **args}
    with pytest.raises(AclError) as err:
        session.launch_kernel(args.pop("stream"), args.pop("duration_us"), **args)
    assert err.value.ret == ret
    assert session.stats() == (0, 0)


def test_disconnect_with_queued_kernels_is_clean(server: RunningAclServer) -> None:
    s = Session.open(server.conf())
    s.init()
    s.set_device(0)
    stream = s.create_stream()
    for _ in range(50):
        s.launch_kernel(stream, 100_000)
    s.close()
    new_session_sees_everything_released(server)


# -- pyACL-shaped API and probe -------------------------------------------------------------------


def test_pyacl_shape(server: RunningAclServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flexnpu_client import acl

    conf_path = tmp_path / "client.conf"
    conf_path.write_text(clientconf.render(server.conf()))
    monkeypatch.setenv("FLEXNPU_CONF", str(conf_path))
    assert acl.rt.set_device(0) == codes.ACL_ERROR_UNINITIALIZE
    assert acl.init() == 0
    try:
        assert acl.init() == codes.ACL_ERROR_REPEAT_INITIALIZE
        assert acl.rt.get_device_count() == (2, 0)
        assert acl.rt.set_device(0) == 0
        ptr, ret = acl.rt.malloc(1024, acl.MEM_MALLOC_HUGE_FIRST)
        assert ret == 0
        assert acl.rt.get_mem_info(acl.HBM_MEM) == (MEM0 - 1024, MEM0, 0)
        host = np.arange(256, dtype=np.uint32)
        assert acl.rt.memcpy(ptr, 1024, host, 1024, acl.ACL_MEMCPY_HOST_TO_DEVICE) == 0
        back = np.zeros(256, dtype=np.uint32)
        assert acl.rt.memcpy(back, 1024, ptr, 1024, acl.ACL_MEMCPY_DEVICE_TO_HOST) == 0
        assert (back == host).all()
        assert acl.rt.malloc(MEM0, 0) == (0, codes.ACL_ERROR_RT_MEMORY_ALLOCATION)
        assert "exceeds the memory quota" in acl.get_last_error()
        stream, ret = acl.rt.create_stream()
        assert ret == 0 and acl.rt.launch_kernel(stream, 100) == 0
        assert acl.rt.synchronize_stream(stream) == 0
        assert acl.rt.free(ptr) == 0
        assert acl.rt.free(ptr) == codes.ACL_ERROR_INVALID_PARAM
    finally:
        assert acl.finalize() == 0
    assert acl.rt.get_device_count() == (0, codes.ACL_ERROR_UNINITIALIZE)


def test_probe_cli(server: RunningAclServer, tmp_path: Path) -> None:
    conf_path = tmp_path / "client.conf"
    conf_path.write_text(clientconf.render(server.conf()))
    env = {**os.environ, "FLEXNPU_CONF": str(conf_path)}
    out = subprocess.run(
        [sys.executable, "-m", "flexnpu_client.probe"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "2 vNPU(s) via unix" in out.stdout
    assert f"device 0: memory free={MEM0} total={MEM0}" in out.stdout
    assert "round trip ok" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "flexnpu_client.probe", "--conf", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 1 and "cannot read client.conf" in bad.stderr


def test_chunked_copy_past_end_changes_nothing(session: Session) -> None:
    session.set_device(1)
    ptr = session.malloc(6 << 20)
    session.memset(ptr, 6 << 20, 0x5A, 6 << 20)
    with pytest.raises(AclError) as err:
        session.memcpy(ptr, 9 << 20, b"\x01" * (9 << 20), 9 << 20, H2D)  # three staging chunks
    assert err.value.ret == codes.ACL_ERROR_INVALID_PARAM
    assert session.copy_from_device(ptr, 6 << 20) == b"\x5a" * (6 << 20)
    out = bytearray(b"\xee" * (9 << 20))
    with pytest.raises(AclError):
        session.memcpy(out, 9 << 20, ptr, 9 << 20, D2H)
    assert out == b"\xee" * (9 << 20)
    assert session.get_device_count() == 2  # the connection is still in step


def test_host_buffers_are_bounded_by_the_claims_memory_quota(
    session: Session, server: RunningAclServer
) -> None:
    before = set(os.listdir(server.spec.shm_dir))
    with pytest.raises(AclError) as err:
        session.malloc_host(MEM0 + MEM1 + 4096)
    assert err.value.ret == codes.ACL_ERROR_RT_MEMORY_ALLOCATION
    hp = session.malloc_host(MEM0)
    with pytest.raises(AclError):
        session.malloc_host(MEM1 + 4096)
    session.free_host(hp)
    assert set(os.listdir(server.spec.shm_dir)) == before
    for bad in (0, -1):
        with pytest.raises(AclError) as err:
            session.malloc_host(bad)
        assert err.value.ret == codes.ACL_ERROR_INVALID_PARAM
