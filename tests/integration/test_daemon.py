"""flexnpu-daemon end to end: a real daemon process, real aclservers, real sockets."""

from __future__ import annotations

import json
import os
import signal
import stat
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from dra_driver.daemon_api.values import EntityState, RegisterRequest
from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput, StateError, Unavailable
from flexnpu_runtime.daemon import processes
from tests.integration import daemon_harness as h
from tests.integration.conftest import MakeDaemon
from tests.integration.daemon_harness import DaemonProc, gone, hello_tcp, ping_unix, request, share, wait_for


@pytest.fixture
def daemon(make_daemon: MakeDaemon) -> DaemonProc:
    return make_daemon()


LAUNCHERS = pytest.mark.parametrize(
    "launcher",
    [pytest.param("zygote", id="zygote"), pytest.param("spawn", id="spawn")],
)


def uid() -> str:
    return str(uuid.uuid4())


@LAUNCHERS
def test_register_serves_both_endpoints_and_lists(make_daemon: MakeDaemon, launcher: str) -> None:
    daemon = make_daemon(extra=("--launcher", launcher))
    claim = uid()
    with daemon.client() as c:
        res = c.register(request(claim, share(2, vid=0, compute=30), share(3, vid=1, mem_gib=2, compute=50)))
        assert res.entity_id == claim and not res.existing
        ep = res.endpoints
        assert ep.shm_dir == str(daemon.shm_root / claim)
        assert ping_unix(ep.unix_socket) == res.pid
        assert hello_tcp(ep.tcp_host, ep.tcp_port, "ab" * 16) == res.pid
        [info] = c.list(probe=True)
        [quick] = c.list()
        health = c.health()
    assert info.entity_id == claim and info.state is EntityState.RUNNING and info.pid == res.pid
    assert info.endpoints == ep and info.restarts == 0 and info.rss_bytes > 0
    assert (
        quick.state is EntityState.RUNNING and quick.rss_bytes == -1
    )  # the cheap List skips /proc/<pid>/statm
    assert [(u.share.die_phy_id, u.share.compute_percent) for u in info.shares] == [(2, 30), (3, 50)]
    assert health.ok and health.entities == 1 and health.dies == 8
    spec = daemon.run_dir / "aclservers" / f"{claim}.spec.json"
    assert stat.S_IMODE(spec.stat().st_mode) == 0o600
    assert json.loads(spec.read_text())["token"] == "ab" * 16
    assert stat.S_IMODE(daemon.socket.stat().st_mode) == 0o600
    entries = json.loads(daemon.registry.read_text())["entries"]
    assert [(e["request"]["claim_uid"], e["state"], e["pid"]) for e in entries] == [
        (claim, "Running", res.pid)
    ]


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(None, id="aclserver"),
        pytest.param(f"{h.FAKE_COMMAND} --with-child", id="group-with-child"),
    ],
)
def test_unregister_stops_group_and_removes_files(make_daemon: MakeDaemon, command: str | None) -> None:
    daemon = make_daemon(command=command)
    claim = uid()
    with daemon.client() as c:
        res = c.register(request(claim))
        members = wait_for(
            lambda: (
                processes.live_group_members(res.pid)
                if command is None or len(processes.live_group_members(res.pid)) > 1
                else []
            ),
            what="aclserver group members",
        )
        assert c.unregister(claim) is True
        assert all(gone(p) for p in members)
        assert not processes.live_group_members(res.pid)
        assert not Path(res.endpoints.shm_dir).exists()
        assert not list((daemon.run_dir / "aclservers").glob(f"{claim}*"))
        assert c.list() == []
        assert c.unregister(claim) is False  # idempotent
        assert c.unregister("never-registered") is False


def test_identical_duplicate_is_idempotent(daemon: DaemonProc) -> None:
    claim = uid()
    with daemon.client() as c:
        first = c.register(request(claim))
        again = c.register(request(claim))
        assert again.existing and (again.pid, again.endpoints) == (first.pid, first.endpoints)
        assert len(c.list()) == 1
    assert len(daemon.aclserver_pids()) == 1


@pytest.mark.parametrize(
    ("second", "error", "code", "field"),
    [
        pytest.param(
            lambda claim: request(claim, share(2, compute=31)),
            StateError,
            ErrorCode.CLAIM_REPLACED,
            "claim_uid",
            id="same-uid-different-shares",
        ),
        pytest.param(
            lambda claim: request(claim, token="cd" * 16),
            StateError,
            ErrorCode.CLAIM_REPLACED,
            "claim_uid",
            id="same-uid-different-token",
        ),
        pytest.param(
            lambda _: request(uid(), share(42)),
            InvalidInput,
            ErrorCode.DEVICE_NOT_FOUND,
            "shares[0].die_phy_id",
            id="unknown-die",
        ),
        pytest.param(
            lambda _: request(uid(), share(3, mem_gib=0)),
            InvalidInput,
            ErrorCode.QUOTA,
            "shares[0].memory_bytes",
            id="memory-quota-0",
        ),
        pytest.param(
            lambda _: request(uid(), share(3, compute=0)),
            InvalidInput,
            ErrorCode.QUOTA,
            "shares[0].compute_percent",
            id="compute-quota-0",
        ),
        pytest.param(
            lambda _: request(uid(), share(3, mem_gib=33)),
            InvalidInput,
            ErrorCode.QUOTA,
            "shares[0].memory_bytes",
            id="memory-over-die",
        ),
        pytest.param(
            lambda _: request(uid(), share(2, policy="elastic")),
            StateError,
            ErrorCode.POLICY_CONFLICT,
            "shares[0].policy",
            id="policy-conflict",
        ),
        pytest.param(
            lambda _: request(uid(), share(2, compute=71)),
            StateError,
            ErrorCode.DEVICE_BUSY,
            "shares.compute_percent",
            id="fixed-compute-over-commit",
        ),
    ],
)
def test_refused_requests_start_nothing(
    daemon: DaemonProc,
    second: Callable[[str], RegisterRequest],
    error: type[FlexNPUError],
    code: ErrorCode,
    field: str,
) -> None:
    claim = uid()
    with daemon.client() as c:
        first = c.register(request(claim, share(2, compute=30)))
        bad = second(claim)
        with pytest.raises(error) as info:
            c.register(bad)
        err = info.value
        assert (err.code, err.field, err.claim_uid) == (code, field, bad.claim_uid)
        if code is ErrorCode.POLICY_CONFLICT:
            assert "die 2" in str(err) and "'fixed'" in str(err) and "'elastic'" in str(err)
        assert [(e.entity_id, e.pid) for e in c.list()] == [(claim, first.pid)]
    assert daemon.aclserver_pids() == [first.pid]
    assert sorted(p.name for p in daemon.shm_root.iterdir() if p.name != ".ledger") == [claim]


def test_aclserver_start_failure_reports_stderr_and_leaves_nothing(make_daemon: MakeDaemon) -> None:
    daemon = make_daemon(command=f"{h.FAKE_COMMAND} --fail")
    claim = uid()
    with daemon.client() as c:
        with pytest.raises(FlexNPUError) as info:
            c.register(request(claim))
        assert "refusing to start" in str(info.value) and claim in str(info.value)
        assert c.list() == []
    assert not (daemon.shm_root / claim).exists()
    assert json.loads(daemon.registry.read_text())["entries"] == []


def test_sigterm_leaves_aclservers_running_and_restart_readopts(daemon: DaemonProc) -> None:
    claim = uid()
    with daemon.client() as c:
        res = c.register(request(claim))
    assert daemon.stop(signal.SIGTERM) == 0
    assert ping_unix(res.endpoints.unix_socket) == res.pid
    daemon.start()
    with daemon.client() as c:
        [info] = c.list()
    assert (info.entity_id, info.pid, info.state) == (claim, res.pid, EntityState.RUNNING)
    assert hello_tcp(res.endpoints.tcp_host, res.endpoints.tcp_port, "ab" * 16) == res.pid
    os.kill(res.pid, signal.SIGKILL)  # an adopted aclserver is monitored and restarted too
    with daemon.client() as c:
        restarted = wait_for(
            lambda: next((i for i in c.list() if i.restarts == 1 and i.state is EntityState.RUNNING), None),
            what="adopted aclserver restarted",
        )
    assert ping_unix(restarted.endpoints.unix_socket) == restarted.pid != res.pid


@LAUNCHERS
def test_sigkill_restart_readopts_live_and_removes_dead(make_daemon: MakeDaemon, launcher: str) -> None:
    daemon = make_daemon(extra=("--launcher", launcher))
    live, dead = uid(), uid()
    with daemon.client() as c:
        a = c.register(request(live, share(2)))
        b = c.register(request(dead, share(3)))
    daemon.stop(signal.SIGKILL)
    os.kill(b.pid, signal.SIGKILL)
    wait_for(lambda: gone(b.pid), what="killed aclserver gone")
    orphan_dir = daemon.shm_root / "not-a-claim"
    orphan_dir.mkdir()
    daemon.start()
    with daemon.client() as c:
        infos = c.list()
        assert [(i.entity_id, i.pid, i.state) for i in infos] == [(live, a.pid, EntityState.RUNNING)]
        assert ping_unix(a.endpoints.unix_socket) == a.pid
        assert c.health().entities == 1
    assert not Path(b.endpoints.shm_dir).exists()
    assert not orphan_dir.exists()
    assert Path(a.endpoints.shm_dir).exists()


@LAUNCHERS
def test_corrupt_registry_is_kept_and_orphans_cleaned(make_daemon: MakeDaemon, launcher: str) -> None:
    daemon = make_daemon(extra=("--launcher", launcher))
    claim = uid()
    with daemon.client() as c:
        res = c.register(request(claim))
    daemon.stop(signal.SIGKILL)
    daemon.registry.write_text('{"version": 1, "entries": [')
    daemon.start()
    copies = list(daemon.state_dir.glob("registry.json.corrupt-*"))
    assert len(copies) == 1 and copies[0].read_text() == '{"version": 1, "entries": ['
    assert "corrupt" in daemon.log()
    wait_for(lambda: gone(res.pid), what="orphan aclserver killed")
    assert not Path(res.endpoints.shm_dir).exists()
    with daemon.client() as c:
        assert c.list() == []
        again = c.register(request(claim))  # the daemon serves normally
        assert ping_unix(again.endpoints.unix_socket) == again.pid


@LAUNCHERS
def test_killed_aclserver_is_restarted_once_and_reported(make_daemon: MakeDaemon, launcher: str) -> None:
    daemon = make_daemon(extra=("--launcher", launcher))
    claim = uid()
    with daemon.client() as c:
        res = c.register(request(claim))
        os.kill(res.pid, signal.SIGKILL)
        info = wait_for(
            lambda: next((i for i in c.list() if i.restarts == 1 and i.state is EntityState.RUNNING), None),
            what="restarted aclserver",
        )
        assert info.pid != res.pid and f"pid {res.pid} exited" in info.message
        assert ping_unix(info.endpoints.unix_socket) == info.pid
        assert hello_tcp(info.endpoints.tcp_host, info.endpoints.tcp_port, "ab" * 16) == info.pid
        assert info.endpoints == res.endpoints  # same unix socket, and the TCP port was still free
        os.kill(info.pid, signal.SIGKILL)  # the restart budget (1) is spent: it stays Exited
        wait_for(
            lambda: json.loads(daemon.registry.read_text())["entries"][0]["state"] == "Exited",
            what="Exited recorded in the registry",
        )
        [exited] = c.list()
        assert (exited.state, exited.restarts, exited.pid) == (EntityState.EXITED, 1, info.pid)
        assert c.unregister(claim) is True


def test_client_reports_unreachable_daemon(tmp_path: Path) -> None:
    from dra_driver.daemon_api.client import DaemonClient

    with DaemonClient(tmp_path / "none.sock", timeout=2) as c, pytest.raises(Unavailable) as info:
        c.list()
    assert info.value.code is ErrorCode.DAEMON_UNAVAILABLE


def test_list_reports_memory_used_by_a_client(daemon: DaemonProc) -> None:
    from flexnpu_client import Session
    from flexnpu_wire import clientconf
    from flexnpu_wire.codes import Policy

    claim = uid()
    with daemon.client() as c:
        res = c.register(request(claim, share(4, mem_gib=1, compute=20)))
        conf = clientconf.ClientConf(
            claim_uid=claim,
            token="ab" * 16,
            endpoints=clientconf.Endpoints(unix=res.endpoints.unix_socket),
            shm_dir=res.endpoints.shm_dir,
            shares=(clientconf.ShareInfo(0, h.GIB, 20, Policy.FIXED),),
        )
        with Session.open(conf) as session:
            session.init()
            session.set_device(0)
            ptr = session.malloc(64 * 1024 * 1024)
            [info] = c.list()
            assert info.shares[0].memory_used_bytes >= 64 * 1024 * 1024
            session.free(ptr)


def test_concurrent_identical_registers_start_one_aclserver(daemon: DaemonProc) -> None:
    from concurrent.futures import ThreadPoolExecutor

    claim = uid()
    with daemon.client() as c, ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: c.register(request(claim)), range(4)))
    assert len({(r.pid, r.endpoints) for r in results}) == 1
    assert sum(not r.existing for r in results) == 1
    assert daemon.aclserver_pids() == [results[0].pid]


def test_register_again_restarts_an_exited_aclserver(make_daemon: MakeDaemon) -> None:
    daemon = make_daemon(extra=("--max-restarts", "0"))
    claim = uid()
    with daemon.client() as c:
        first = c.register(request(claim))
        os.kill(first.pid, signal.SIGKILL)
        wait_for(
            lambda: json.loads(daemon.registry.read_text())["entries"][0]["state"] == "Exited",
            what="Exited recorded (no automatic restart with --max-restarts 0)",
        )
        again = c.register(request(claim))
        assert again.existing and again.pid != first.pid
        assert again.endpoints == first.endpoints
        assert ping_unix(again.endpoints.unix_socket) == again.pid
        [info] = c.list()
        assert (info.state, info.pid) == (EntityState.RUNNING, again.pid)


def test_unresponsive_aclserver_is_reported_unknown(daemon: DaemonProc) -> None:
    claim = uid()
    with daemon.client() as c:
        res = c.register(request(claim))
        os.kill(res.pid, signal.SIGSTOP)
        try:
            [info] = c.list()
            assert info.state == EntityState.RUNNING  # the periodic list does not probe
            [info] = c.list(probe=True)
            assert (info.state, info.pid) == (EntityState.UNKNOWN, res.pid)
            assert "does not answer PING" in info.message
        finally:
            os.kill(res.pid, signal.SIGCONT)
        [info] = c.list()
        assert (info.state, info.pid, info.restarts) == (EntityState.RUNNING, res.pid, 0)
