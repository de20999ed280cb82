"""libascendcl.so refuses a client.conf that is not a readable regular file of sane size, in bounded
time, with a clean ACL code and a message naming the file and what it is (issue 16 item 5).

Real files each: a FIFO nobody writes (aclInit used to hang on it), a directory, a character
device, a unix socket, a symlink, a 1 GiB sparse file, and a mode-000 file read by a child that
dropped root. aclrtGetDeviceCount, which reads client.conf before aclInit, refuses them alike.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.c.conftest import Claim, run

INVALID_FILE, INVALID_FILE_SIZE = 100003, 100005
NOBODY = 65534
BOUND_S = 10  # every refusal comes back well within this; a hang would hit the subprocess timeout


def _fifo(d: Path) -> Path:
    os.mkfifo(d / "client.conf")
    return d / "client.conf"


def _directory(d: Path) -> Path:
    (d / "client.conf").mkdir()
    return d / "client.conf"


def _device(d: Path) -> Path:
    return Path("/dev/null")


def _sparse(d: Path) -> Path:
    path = d / "client.conf"
    with path.open("wb") as f:
        f.truncate(1 << 30)
    return path


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "client.conf"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))
        s.listen(1)
        yield path


FILES = [
    pytest.param(_fifo, INVALID_FILE, "is a FIFO, not a regular file", id="fifo"),
    pytest.param(_directory, INVALID_FILE, "is a directory, not a regular file", id="directory"),
    pytest.param(_device, INVALID_FILE, "is a character device, not a regular file", id="char-device"),
    pytest.param(_sparse, INVALID_FILE_SIZE, "1073741824 bytes, more than the 1048576", id="sparse-1gib"),
]


@pytest.mark.parametrize(("make", "code", "text"), FILES)
def test_a_client_conf_that_is_no_regular_file_is_refused_at_once(
    acl_check: Path, tmp_path: Path, make: Callable[[Path], Path], code: int, text: str
) -> None:
    conf = make(tmp_path)
    values = run(acl_check, "init", conf=conf, timeout=BOUND_S).values
    assert int(values["init_code"]) == code, values
    assert f"client.conf {conf}" in values["init_msg"] and text in values["init_msg"], values


def test_a_unix_socket_is_refused(acl_check: Path, unix_socket: Path) -> None:
    values = run(acl_check, "init", conf=unix_socket, timeout=BOUND_S).values
    assert int(values["init_code"]) == INVALID_FILE, values
    assert "is a socket, not a regular file" in values["init_msg"], values


def test_a_symlink_to_a_good_client_conf_is_refused(acl_check: Path, claim: Claim, tmp_path: Path) -> None:
    link = tmp_path / "client.conf"
    link.symlink_to(claim.conf)
    values = run(acl_check, "init", conf=link, timeout=BOUND_S).values
    assert int(values["init_code"]) == INVALID_FILE, values
    assert "is a symbolic link (symbolic links are not followed)" in values["init_msg"], values


def test_the_device_count_before_acl_init_refuses_a_fifo_too(acl_semantics: Path, tmp_path: Path) -> None:
    conf = _fifo(tmp_path)
    values = run(acl_semantics, "preinit", "1", conf=conf, timeout=BOUND_S).values
    assert int(values["count_code"]) == INVALID_FILE, values
    assert "aclrtGetDeviceCount" in values["count_msg"] and "FIFO" in values["count_msg"], values


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another uid needs root (CI runs as root)")
def test_an_unreadable_client_conf_is_refused_for_a_process_without_root(
    acl_check: Path, claim: Claim, tmp_path: Path
) -> None:
    """Mode 000 as seen by uid 65534: the program runs in a child that dropped root before exec."""
    public = Path("/tmp") / f"fc-conf-{os.getpid()}-{tmp_path.name}"  # tmp_path is root's alone
    public.mkdir(mode=0o755)
    try:
        conf = public / "client.conf"
        shutil.copy(claim.conf, conf)
        conf.chmod(0)
        res = subprocess.run(
            [str(acl_check), "init"], capture_output=True, text=True, timeout=BOUND_S, check=False, user=NOBODY,
            group=NOBODY, extra_groups=[], env={"FLEXNPU_CONF": str(conf)},
        )  # fmt: skip
        values = dict(line[4:].split(" ", 1) for line in res.stdout.splitlines() if line.startswith("val "))
        assert int(values["init_code"]) == INVALID_FILE, res.stdout + res.stderr
        assert f"not readable by uid {NOBODY}: Permission denied" in values["init_msg"], values
    finally:
        shutil.rmtree(public)
