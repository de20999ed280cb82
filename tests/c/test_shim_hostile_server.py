"""libascendcl.so against a server that answers HELLO with broken frames (a stand-in on a unix
socket, not the aclserver): every case ends in a clear error code within the connect timeout,
with the library built with AddressSanitizer and UndefinedBehaviorSanitizer, so a bad length,
count or name is never read past, trusted or followed. Model descriptions too (issue 25 class
11: a header shorter than its fixed part was read past, an AddressSanitizer heap-buffer-overflow)."""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexnpu_testing import clibrary
from flexnpu_wire import framing as protocol
from flexnpu_wire import modelfile as mf
from flexnpu_wire.framing import Op
from tests.c.conftest import HERE, run


def _reply(
    ints: tuple[int, ...], tail: bytes = b"", *, op: int = Op.HELLO, rid: int = 1, flags: int = 1
) -> bytes:
    return protocol.encode(op, rid, ints, tail, flags=flags)


CASES = [
    pytest.param(b"", "closed the connection", id="closes-at-once"),
    pytest.param(b"\x00\x00\x00", "closed the connection", id="truncated-length"),
    pytest.param(struct.pack(">I", 1 << 30), "malformed frame", id="length-beyond-1MiB"),
    pytest.param(struct.pack(">I", 3) + b"abc", "malformed frame", id="shorter-than-header"),
    pytest.param(
        struct.pack(">IHHIB", 9 + 8, Op.HELLO, 1, 1, 200) + b"\0" * 8, "malformed frame", id="count-past-end"
    ),
    pytest.param(_reply((0, 1, 1, 4096), b"x", flags=0), "malformed frame", id="not-a-reply"),
    pytest.param(_reply((0, 1, 1, 4096), b"x", rid=99), "malformed frame", id="wrong-request-id"),
    pytest.param(_reply((0,)), "malformed frame", id="hello-reply-too-short"),
    pytest.param(_reply((0, 1, 0, 4096), b"staging"), "out of range", id="zero-devices"),
    pytest.param(_reply((0, 1, 1, 1 << 50), b"staging"), "out of range", id="huge-staging"),
    pytest.param(_reply((0, 1, 1, 4096), b"../../etc/passwd"), "invalid region file", id="name-with-slash"),
    pytest.param(_reply((0, 1, 1, 4096), b".hidden"), "invalid region file", id="dot-name"),
    pytest.param(_reply((0, 1, 1, 4096), b"a\0b"), "invalid region file", id="name-with-nul"),
    pytest.param(_reply((0, 1, 1, 4096), b""), "invalid region file", id="empty-name"),
    pytest.param(_reply((0, 1, 1, 4096), b"missing.buf"), "cannot open data-link region", id="absent-file"),
    pytest.param(
        _reply((0, 1, 1, 1 << 20), b"small.buf"), "is not a 1048576-byte regular file", id="file-too-small"
    ),
    pytest.param(_reply((0, 1, 1, 4096), b"link.buf"), "cannot open data-link region", id="symlink"),
    pytest.param(_reply((207005,), b"\xff\xfe not utf-8 " * 200), "not utf-8", id="long-binary-message"),
]


GOOD_HELLO = _reply((0, 1, 1, 4096), b"stage.buf")
LATER = [
    pytest.param([_reply((0,), op=Op.INIT, rid=3)], "malformed frame", id="init-reply-wrong-id"),
    pytest.param([b"\x00\x00\x00\x09" + b"\x00" * 5], "closed the connection", id="init-reply-truncated"),
    pytest.param(
        [
            _reply((0,), op=Op.INIT, rid=2),
            _reply((0,), op=Op.SET_DEVICE, rid=3),
            _reply((0, 5), op=14, rid=4),
        ],
        "malformed frame",
        id="mem-info-reply-short",
    ),
]


@pytest.fixture(scope="module")
def sanitized_check() -> Path:
    lib = clibrary.build_library(sanitized=True)
    return clibrary.compile_program(
        HERE / "acl_check.c", link_library=lib, extra_flags=[*clibrary.SANITIZERS, "-g"], out_dir=lib.parent
    )


@pytest.fixture
def fake_server(tmp_path: Path) -> Iterator[tuple[Path, list[list[bytes]]]]:
    """A unix socket that reads one request per connection and answers with the next scripted bytes."""
    sock_path = tmp_path / "s.sock"
    script: list[list[bytes]] = []
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(sock_path))
    srv.listen(4)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                replies = script.pop(0) if script else []
                try:
                    for reply in replies:  # one reply per request, in order
                        if not conn.recv(4096):
                            break
                        conn.sendall(reply)
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    (tmp_path / "small.buf").write_bytes(b"\0" * 100)
    (tmp_path / "stage.buf").write_bytes(b"\0" * 4096)
    (tmp_path / "link.buf").symlink_to(tmp_path / "small.buf")
    yield sock_path, script
    stop.set()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as wake:  # unblock accept()
        wake.connect(str(sock_path))
    t.join(10)
    srv.close()


def _conf(tmp_path: Path, sock_path: Path) -> Path:
    conf = tmp_path / "client.conf"
    conf.write_text(
        json.dumps(
            {
                "version": 1, "claim_uid": "hostile", "token": "ab" * 16, "endpoints": {"unix": str(sock_path)},
                "shm_dir": str(tmp_path), "shares": [{"virtual_id": 0, "memory_bytes": 1, "compute_percent": 1,
                                                        "policy": "fixed"}],
            }
        )
    )  # fmt: skip
    return conf


def _init(exe: Path, conf: Path) -> dict[str, str]:
    env = {"ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1", "FLEXNPU_CONNECT_TIMEOUT_MS": "2000"}
    res = run(exe, "init", conf=conf, timeout=30, **env)
    assert "Sanitizer" not in res.stderr and "runtime error" not in res.stderr, res.stderr[-4000:]
    return res.values


@pytest.mark.parametrize(("reply", "text"), CASES)
def test_broken_hello_replies(
    sanitized_check: Path,
    fake_server: tuple[Path, list[list[bytes]]],
    tmp_path: Path,
    reply: bytes,
    text: str,
) -> None:
    sock_path, script = fake_server
    script.append([reply])
    values = _init(sanitized_check, _conf(tmp_path, sock_path))
    assert values["init_code"] != "0", values
    assert text in values["init_msg"], values
    assert float(values["init_ms"]) < 5000


@pytest.mark.parametrize(("replies", "text"), LATER)
def test_broken_replies_after_hello(
    sanitized_check: Path,
    fake_server: tuple[Path, list[list[bytes]]],
    tmp_path: Path,
    replies: list[bytes],
    text: str,
) -> None:
    sock_path, script = fake_server
    script.append([GOOD_HELLO, *replies])
    values = _init(sanitized_check, _conf(tmp_path, sock_path))
    failed = values["init_msg"] if values["init_code"] != "0" else values.get("meminfo_msg", "")
    assert values["init_code"] != "0" or values["meminfo_code"] != "0", values
    assert text in failed, values


def _desc(**patch: int) -> bytes:
    """A valid model description (one input, one output) with fields of its fixed part replaced:
    ``size`` (the header's byte count, at 12), ``n_in`` (at 40), ``n_out`` (at 44)."""
    t = mf.Tensor("x", 0, mf.FORMAT_ND, (4,))
    y = mf.Tensor("y", 0, mf.FORMAT_ND, (4,))
    header = bytearray(mf.render_header(mf.ModelFile(inputs=(t,), outputs=(mf.Output(y),))))
    for name, value in patch.items():
        struct.pack_into("<I", header, {"size": 12, "n_in": 40, "n_out": 44}[name], value)
    return bytes(header)


DESCRIPTIONS = [
    # issue 25 class 11: a header shorter than its fixed part made the parser start past its end
    pytest.param(_desc(size=16)[:64], "malformed model description", id="header-shorter-than-fixed-part"),
    pytest.param(_desc(size=0), "malformed model description", id="header-size-zero"),
    pytest.param(_desc(size=64), "runs past its header", id="tensors-past-the-header-size"),
    pytest.param(_desc(size=1 << 20), "malformed model description", id="header-size-past-the-reply"),
    pytest.param(_desc(n_in=200, size=128)[:128], "runs past its header", id="count-past-the-reply"),
    pytest.param(_desc(n_in=100000), "too many entries", id="huge-count"),
    pytest.param(_desc()[:70], "malformed model description", id="cut-short"),
]


@pytest.mark.parametrize(("tail", "text"), DESCRIPTIONS)
def test_hostile_model_descriptions(
    sanitized_check: Path, fake_server: tuple[Path, list[list[bytes]]], tmp_path: Path, tail: bytes, text: str
) -> None:
    sock_path, script = fake_server
    script.append(
        [
            GOOD_HELLO,
            _reply((0,), op=Op.INIT, rid=2),
            _reply((0,), op=Op.SET_DEVICE, rid=3),
            _reply((0,), tail, op=Op.MODEL_GET_DESC, rid=4),
        ]
    )
    env = {"ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1", "FLEXNPU_CONNECT_TIMEOUT_MS": "2000"}
    res = run(sanitized_check, "desc", conf=_conf(tmp_path, sock_path), timeout=30, **env)
    assert "Sanitizer" not in res.stderr and "runtime error" not in res.stderr, res.stderr[-4000:]
    assert res.values["init_code"] == "0", res.values
    assert res.values["desc_code"] != "0" and text in res.values["desc_msg"], res.values


def test_a_valid_model_description_is_read(
    sanitized_check: Path, fake_server: tuple[Path, list[list[bytes]]], tmp_path: Path
) -> None:
    """The same server with an intact description: the checks refuse only what is broken."""
    sock_path, script = fake_server
    script.append(
        [
            GOOD_HELLO,
            _reply((0,), op=Op.INIT, rid=2),
            _reply((0,), op=Op.SET_DEVICE, rid=3),
            _reply((0,), _desc(), op=Op.MODEL_GET_DESC, rid=4),
        ]
    )
    res = run(
        sanitized_check, "desc", conf=_conf(tmp_path, sock_path), timeout=30, ASAN_OPTIONS="detect_leaks=1"
    )
    assert "Sanitizer" not in res.stderr, res.stderr[-4000:]
    assert (res.values["desc_code"], res.values["desc_inputs"]) == ("0", "1"), res.values
