"""Each claim's shm dir is its own bounded tmpfs; a symlinked shm dir is never followed; usage per vNPU.

A real daemon (root: it mounts), real aclservers, a hostile container simulated by writing into
its own shm dir until the filesystem is full, while another claim keeps working.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver import clientconf
from dra_driver.daemon import shmfs
from dra_driver.daemon_api.values import EntityInfo
from flexnpu_client import AclError, Session
from flexnpu_wire.codes import Policy
from flexnpu_wire.launch import DEFAULT_STAGING_BYTES
from tests.integration.daemon_harness import GIB, DaemonProc, request, share, wait_for

MAX_SESSIONS = 2


@pytest.fixture
def daemon() -> Iterator[DaemonProc]:
    d = DaemonProc(extra=("--max-sessions", str(MAX_SESSIONS), "--shm-mount", "always"))
    try:
        yield d.start()
    finally:
        d.cleanup()


def _conf(res_unix: str, shm_dir: str, uid: str) -> clientconf.ClientConf:
    return clientconf.ClientConf(
        claim_uid=uid,
        token="ab" * 16,
        endpoints=clientconf.Endpoints(unix=res_unix),
        shm_dir=shm_dir,
        shares=(clientconf.ShareInfo(0, GIB // 4, 30, Policy.FIXED),),
    )


def _fill(directory: Path) -> int:
    """Write into ``directory`` until the filesystem says ENOSPC; bytes written."""
    written = 0
    chunk = b"\xff" * (1 << 20)
    with open(directory / "hostile.fill", "wb", buffering=0) as fh:
        while True:
            try:
                n = fh.write(chunk)
            except OSError as exc:
                assert exc.errno == 28, exc  # ENOSPC
                return written
            written += n or 0


def test_a_container_can_fill_only_its_own_shm_dir(daemon: DaemonProc) -> None:
    hostile, honest = str(uuid.uuid4()), str(uuid.uuid4())
    with daemon.client() as c:
        bad = c.register(request(hostile, share(2, mem_gib=0.25)))
        good = c.register(request(honest, share(3, mem_gib=0.25)))
    bad_dir, good_dir = Path(bad.endpoints.shm_dir), Path(good.endpoints.shm_dir)
    assert shmfs.is_mount(bad_dir) and shmfs.is_mount(good_dir)
    assert oct(os.stat(bad_dir).st_mode & 0o777) == "0o711"
    limit = shmfs.size_for(
        host_memory_bytes=GIB // 4, max_sessions=MAX_SESSIONS, staging_bytes=DEFAULT_STAGING_BYTES
    )
    written = _fill(bad_dir)
    assert 0 < written <= limit
    node_shm = os.statvfs("/dev/shm")
    assert node_shm.f_bavail * node_shm.f_frsize > 64 << 20  # the node's /dev/shm still has room
    # the other claim's client still gets a session (its staging region needs shm space) and works
    conf = _conf(good.endpoints.unix_socket, str(good_dir), honest)
    with Session.open(conf) as s:
        s.init()
        s.set_device(0)
        ptr = s.malloc(8 << 20)
        s.copy_to_device(ptr, b"z" * (4 << 20))
        assert s.copy_from_device(ptr, 4 << 20) == b"z" * (4 << 20)
    # and a new claim still starts
    with daemon.client() as c:
        third = c.register(request(str(uuid.uuid4()), share(4, mem_gib=0.25)))
        assert third.pid > 0
        assert c.unregister(hostile)
    assert not bad_dir.exists() and not shmfs.is_mount(bad_dir)


def test_symlinked_shm_dir_is_replaced_not_followed(daemon: DaemonProc, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious\n")
    claim = str(uuid.uuid4())
    (daemon.shm_root / claim).symlink_to(victim)
    with daemon.client() as c:
        res = c.register(request(claim, share(2, mem_gib=0.25)))
        shm = Path(res.endpoints.shm_dir)
        assert not shm.is_symlink() and shm.is_dir()
        assert sorted(os.listdir(victim)) == ["keep"]  # nothing was created through the link
        assert c.unregister(claim)
    assert (victim / "keep").read_text() == "precious\n"


def test_list_reports_usage_per_vnpu(daemon: DaemonProc) -> None:
    claim = str(uuid.uuid4())
    with daemon.client() as c:
        res = c.register(
            request(claim, share(2, vid=0, mem_gib=0.25, compute=30), share(3, vid=1, mem_gib=0.5))
        )
    conf = clientconf.ClientConf(
        claim_uid=claim,
        token="ab" * 16,
        endpoints=clientconf.Endpoints(unix=res.endpoints.unix_socket),
        shm_dir=res.endpoints.shm_dir,
        shares=(
            clientconf.ShareInfo(0, GIB // 4, 30, Policy.FIXED),
            clientconf.ShareInfo(1, GIB // 2, 30, Policy.FIXED),
        ),
    )
    with Session.open(conf) as a, Session.open(conf) as b:
        a.init()
        a.set_device(1)
        b.init()
        b.set_device(1)
        a.malloc(64 << 20)
        b.malloc(32 << 20)

        def usage() -> EntityInfo | None:
            with daemon.client() as c:
                info = next(e for e in c.list(probe=True) if e.entity_id == claim)
            return (
                info
                if info.shares[1].sessions == 2 and info.shares[1].memory_used_bytes == 96 << 20
                else None
            )

        info = wait_for(usage, what="usage of vNPU 1 with two sessions")
        first, second = info.shares
        assert first.share.virtual_id == 0 and first.memory_used_bytes == 0 and first.sessions == 2
        assert second.share.memory_bytes == GIB // 2 and second.compute_used_us >= 0


@pytest.mark.root
def test_auto_mounts_only_where_the_mount_reaches_other_namespaces(tmp_path: Path) -> None:
    root = tmp_path / "shmroot"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "fnpu-prop-test", str(root)], check=True)
    try:
        subprocess.run(["mount", "--make-private", str(root)], check=True)
        assert not shmfs.propagates(root / "claim")
        subprocess.run(["mount", "--make-shared", str(root)], check=True)
        assert shmfs.propagates(root / "claim")
    finally:
        subprocess.run(["umount", "-l", str(root)], check=True)


def test_host_memory_sizes_the_tmpfs_and_bounds_host_buffers(daemon: DaemonProc) -> None:
    """A share of 256 MiB device memory with a 512 MiB host-memory limit: the claim's tmpfs is sized
    from the host limit (not the device quota), and the aclserver gives host buffers up to it."""
    uid = str(uuid.uuid4())
    host = GIB // 2
    with daemon.client() as c:
        res = c.register(request(uid, dataclasses.replace(share(2, mem_gib=0.25), host_memory_bytes=host)))
    shm_dir = Path(res.endpoints.shm_dir)
    fs = os.statvfs(shm_dir)
    expected = shmfs.size_for(
        host_memory_bytes=host, max_sessions=MAX_SESSIONS, staging_bytes=DEFAULT_STAGING_BYTES
    )
    assert abs(fs.f_blocks * fs.f_frsize - expected) <= fs.f_frsize
    with Session.open(_conf(res.endpoints.unix_socket, str(shm_dir), uid)) as s:
        s.init()
        s.set_device(0)
        first = s.malloc_host(
            GIB // 4 + (64 << 20)
        )  # more than the device quota: host memory is not device memory
        assert s.get_mem_info() == (GIB // 4, GIB // 4)
        with pytest.raises(AclError) as err:
            s.malloc_host(GIB // 4)  # 320 + 256 MiB > the 512 MiB host limit
        assert err.value.ret == 207001 and "hostMemory" in err.value.message
        s.free_host(first)
        s.free_host(s.malloc_host(host))
