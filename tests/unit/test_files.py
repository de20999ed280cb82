"""dra_driver/files.py: atomic writes that cannot be torn, no-follow reads, timed locks."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver import files


def test_write_atomic_round_trip_and_exact_mode(tmp_path: Path) -> None:
    target = tmp_path / "d" / "state.json"
    old = os.umask(0o077)
    try:
        files.write_atomic(target, b"hello", mode=0o640, dir_mode=0o700)
    finally:
        os.umask(old)
    assert target.read_bytes() == b"hello"
    assert target.stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o700
    assert [p.name for p in target.parent.iterdir()] == ["state.json"]


def test_write_atomic_replaces_a_symlink_instead_of_writing_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    link = tmp_path / "spec.json"
    link.symlink_to(victim)
    files.write_atomic(link, b"new")
    assert victim.read_bytes() == b"keep"
    assert not link.is_symlink()
    assert link.read_bytes() == b"new"


def test_write_atomic_refuses_a_symlinked_parent_directory(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "claims").symlink_to(real)
    with pytest.raises(files.NotRegular):
        files.write_atomic(tmp_path / "claims" / "c" / "client.conf", b"x", dir_mode=0o700)
    assert list(real.iterdir()) == []


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, so that a write runs out of space for real (needs root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.root
def test_a_full_disk_leaves_the_previous_file_intact(tiny_fs: Path) -> None:
    target = tiny_fs / "checkpoint.json"
    files.write_atomic(target, b"good" * 10)
    with pytest.raises(files.WriteFailed) as err:
        files.write_atomic(target, b"x" * (1 << 20))
    assert err.value.errno == 28  # ENOSPC
    assert target.read_bytes() == b"good" * 10
    assert [p.name for p in tiny_fs.iterdir()] == ["checkpoint.json"]  # no temp file left


def test_read_nofollow_refuses_symlinks_and_oversize_files(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.write_bytes(b"0123456789")
    link = tmp_path / "link"
    link.symlink_to(real)
    assert files.read_nofollow(real) == b"0123456789"
    with pytest.raises(files.NotRegular):
        files.read_nofollow(link)
    with pytest.raises(files.NotRegular):
        files.read_nofollow(tmp_path)
    with pytest.raises(files.FileError):
        files.read_nofollow(real, max_bytes=4)
    with pytest.raises(FileNotFoundError):
        files.read_nofollow(tmp_path / "absent")


def test_remove_nofollow_removes_the_link_not_its_target(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.write_bytes(b"x")
    link = tmp_path / "link"
    link.symlink_to(real)
    assert files.remove_nofollow(link) is True
    assert real.exists()
    assert files.remove_nofollow(link) is False


def test_locked_times_out_while_another_holder_keeps_it(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with files.locked(lock, timeout=5):
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(5)
        with pytest.raises(files.LockTimeout):
            with files.locked(lock, timeout=0.05):
                pass
    finally:
        release.set()
        t.join()
    with files.locked(lock, timeout=1):
        pass


def test_boot_id_reads_the_kernel_value_and_tolerates_absence(tmp_path: Path) -> None:
    assert len(files.boot_id()) == 36
    assert files.boot_id(tmp_path / "absent") == ""
