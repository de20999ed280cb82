"""Each claim's shm dir is its own bounded tmpfs wherever that can reach the containers; a symlinked shm
dir is never followed; usage per vNPU.

A real daemon (root: it mounts), real aclservers, a hostile container simulated by writing into its own
shm dir until the filesystem is full, while another claim keeps working. ``--shm-mount auto`` is decided
by mount namespace: a daemon in the host's namespace bounds the claims of a *private* shm root (the case
that used to fall back to plain directories); a daemon in a namespace of its own (``unshare``, as in a
pod) bounds them only on a shared root - which ``python3 -m flexnpu_runtime.daemon.shmroot`` makes from the
host's namespace - and otherwise refuses every share, saying why, unless the operator chose ``never``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.daemon_api.values import EntityInfo
from dra_driver.errors import ErrorCode, StateError
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_client import AclError, Session
from flexnpu_runtime.daemon import shmfs, shmroot
from flexnpu_testing.fake_apiserver import FakeAPIServer
from flexnpu_wire import clientconf
from flexnpu_wire.codes import Policy
from flexnpu_wire.launch import DEFAULT_STAGING_BYTES
from tests.integration.conftest import NAMESPACE, NODE, make_node
from tests.integration.daemon_harness import GIB, DaemonProc, request, share, wait_for
from tests.integration.lifecycle_helpers import share_request

pytestmark = pytest.mark.root  # every test mounts (the daemon's tmpfs, private or shared roots)

MAX_SESSIONS = 2
WHOLE = {"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}


class OwnNamespaceDaemon(DaemonProc):
    """A daemon in a mount namespace of its own, as in a pod: its copy of the host's mounts private
    (``--propagation private``) or still peers of the host's where those are shared (``unchanged``)."""

    def __init__(self, propagation: str, extra: tuple[str, ...] = ()) -> None:
        super().__init__(extra=extra)
        self.propagation = propagation

    def argv(self) -> list[str]:
        return ["unshare", "--mount", f"--propagation={self.propagation}", *super().argv()]


@contextlib.contextmanager
def _private_root(d: DaemonProc) -> Iterator[DaemonProc]:
    """``d``'s shm root as a private tmpfs of its own (a host whose /dev/shm is private); cleaned after."""
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2g", "fnpu-private-root", str(d.shm_root)], check=True
    )
    subprocess.run(["mount", "--make-private", str(d.shm_root)], check=True)
    try:
        yield d
    finally:
        with contextlib.suppress(Exception):
            d.stop()
        shmfs.unmount_all_under(d.shm_root)
        while os.path.ismount(d.shm_root):  # the root tmpfs, and a bind of it that shmroot made
            subprocess.run(["umount", "-l", str(d.shm_root)], check=True)
        d.cleanup()


@pytest.fixture
def daemon() -> Iterator[DaemonProc]:
    """A daemon in the host's mount namespace with a private shm root and the default --shm-mount auto."""
    with _private_root(DaemonProc(extra=("--max-sessions", str(MAX_SESSIONS)))) as d:
        assert not shmroot.propagates(d.shm_root) and shmroot.in_runtime_namespace()
        yield d.start()


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


def test_auto_mounts_only_where_the_mount_reaches_other_namespaces(tmp_path: Path) -> None:
    root = tmp_path / "shmroot"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "fnpu-prop-test", str(root)], check=True)
    try:
        subprocess.run(["mount", "--make-private", str(root)], check=True)
        assert not shmroot.propagates(root / "claim")
        subprocess.run(["mount", "--make-shared", str(root)], check=True)
        assert shmroot.propagates(root / "claim")
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


def _probe_daemon(d: DaemonProc) -> subprocess.CompletedProcess[str]:
    return d.probe("daemon")


def test_a_daemon_in_its_own_namespace_refuses_shares_it_cannot_bound() -> None:
    with _private_root(OwnNamespaceDaemon("private")) as d:
        d.start()
        with d.client() as c:
            problem = c.health().shm_problem
            assert "not on a shared mount" in problem and str(d.shm_root) in problem
            claim = str(uuid.uuid4())
            with pytest.raises(StateError) as info:
                c.register(request(claim, share(2, mem_gib=0.25)))
        err = info.value
        assert err.code == ErrorCode.SHM_UNBOUNDED and err.claim_uid == claim and err.field == "shm-mount"
        assert "not on a shared mount" in err.message and "--shm-mount never" in err.message
        assert not d.aclserver_pids() and not (d.shm_root / claim).exists()  # nothing half-made
        probe = _probe_daemon(d)
        assert probe.returncode == 1 and "refuses shares" in probe.stderr, probe.stderr
        assert "shares are refused on this node" in d.log()


def test_never_is_the_operators_choice_even_where_the_bound_cannot_be_kept() -> None:
    with _private_root(OwnNamespaceDaemon("private", extra=("--shm-mount", "never"))) as d:
        d.start()
        with d.client() as c:
            assert c.health().shm_problem == ""
            res = c.register(request(str(uuid.uuid4()), share(2, mem_gib=0.25)))
        assert not shmfs.is_mount(Path(res.endpoints.shm_dir))  # plain directories, as chosen
        assert _probe_daemon(d).returncode == 0
        assert "plain directories (--shm-mount never)" in d.log()


def test_a_root_made_shared_from_the_host_namespace_bounds_a_pod_like_daemons_claims() -> None:
    with _private_root(OwnNamespaceDaemon("unchanged", extra=("--max-sessions", str(MAX_SESSIONS)))) as d:
        # what the chart's init container does: from a namespace of its own, enter the host's one
        # (through the host's /proc) and make the root a shared mount point there
        made = subprocess.run(
            ["unshare", "--mount", "--propagation=private", sys.executable, "-m", "flexnpu_runtime.daemon.shmroot",
             "--host-proc", "/proc", str(d.shm_root)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert made.returncode == 0 and "now a shared mount point" in made.stdout, made.stdout + made.stderr
        assert shmroot.propagates(d.shm_root / "claim")
        d.start()
        hostile, honest = str(uuid.uuid4()), str(uuid.uuid4())
        with d.client() as c:
            assert c.health().shm_problem == ""
            bad = c.register(request(hostile, share(2, mem_gib=0.25)))
            good = c.register(request(honest, share(3, mem_gib=0.25)))
        bad_dir, good_dir = Path(bad.endpoints.shm_dir), Path(good.endpoints.shm_dir)
        # the daemon's tmpfs mounts, made in its own namespace, reached the host's
        assert shmfs.is_mount(bad_dir) and shmfs.is_mount(good_dir)
        limit = shmfs.size_for(
            host_memory_bytes=GIB // 4, max_sessions=MAX_SESSIONS, staging_bytes=DEFAULT_STAGING_BYTES
        )
        assert 0 < _fill(bad_dir) <= limit
        with Session.open(_conf(good.endpoints.unix_socket, str(good_dir), honest)) as s:
            s.init()
            s.set_device(0)
            ptr = s.malloc(8 << 20)
            s.copy_to_device(ptr, b"q" * (4 << 20))
            assert s.copy_from_device(ptr, 4 << 20) == b"q" * (4 << 20)
        again = subprocess.run(
            [sys.executable, "-m", "flexnpu_runtime.daemon.shmroot", str(d.shm_root)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert again.returncode == 0 and "nothing to do" in again.stdout  # idempotent


def test_the_node_says_why_it_refuses_shares_and_keeps_serving_whole_dies(
    api: FakeAPIServer, short_tmp: Path
) -> None:
    with _private_root(OwnNamespaceDaemon("private")) as d:
        d.start()
        n = make_node(
            api,
            short_tmp / "n",
            "eight-910b4.yaml",
            FLEXNPU_DAEMON_SOCKET=str(d.socket),
            FLEXNPU_SHM_DIR=str(d.shm_root),
            FLEXNPU_DEFAULT_MODE="both",
        )
        try:
            n.start()
            wait_for(n.devices, what="published devices")
            assert n.kubelet is not None
            share_claim = ClaimRef(NAMESPACE, n.create_claim("share", [share_request()]), "share")
            n.scheduler.allocate(NAMESPACE, "share", NODE)
            err = n.kubelet.prepare([share_claim])[share_claim.uid].error
            assert "ShmUnbounded" in err and share_claim.uid in err and "not on a shared mount" in err, err
            # the log, a Node Event and the plugin's readiness say why
            assert "refuses every new share" in n.log()

            def events() -> list[dict[str, object]]:
                raw = n.api_core().list_namespaced_event("default", _preload_content=False)
                items: list[dict[str, object]] = json.loads(raw.data)["items"]
                return [e for e in items if e["reason"] == "FlexNPUShmUnbounded"]

            (event,) = wait_for(events, what="the FlexNPUShmUnbounded Node event")
            assert "not on a shared mount" in str(event["message"])
            probe = subprocess.run(
                [sys.executable, "-m", "dra_driver.probes", "plugin"],
                env=n.env, capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert probe.returncode == 1 and "refuses shares" in probe.stderr, probe.stderr
            # and the node keeps serving what needs no shm dir
            whole = ClaimRef(NAMESPACE, n.create_claim("whole", [WHOLE]), "whole")
            n.scheduler.allocate(NAMESPACE, "whole", NODE)
            assert n.kubelet.prepare([whole])[whole.uid].error == ""
            assert n.kubelet.unprepare([whole, share_claim]) == {whole.uid: "", share_claim.uid: ""}
        finally:
            n.stop()
