"""Each aclserver in its own bounded cgroup: real daemon, real aclservers, the host's cgroup file system.

Every daemon here has a cgroup parent of its own (``DaemonProc``), removed at the end, so nothing
of another test (or another daemon on this host) is touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from dra_driver.daemon_api.values import EntityInfo, EntityState
from dra_driver.errors import ErrorCode, StateError
from flexnpu_runtime.daemon import bounds, cgroups
from flexnpu_testing.daemon import FAKE, DaemonProc, existing_cgroups, gone, holds, ping_unix, request, share
from flexnpu_testing.waiting import wait_for
from flexnpu_wire.launch import DEFAULT_STAGING_BYTES
from tests.integration.conftest import MakeDaemon

MIB = 1024 * 1024
LAUNCHERS = pytest.mark.parametrize(
    "launcher", [pytest.param("zygote", id="zygote"), pytest.param("spawn", id="spawn")]
)


def uid() -> str:
    return str(uuid.uuid4())


def host_cgroups(parent: str) -> cgroups.Cgroups | None:
    """The claims' cgroups a daemon made under ``parent`` in the host's cgroup file system."""
    return existing_cgroups(parent, Path("/sys/fs/cgroup"))


def claim_cgroups(daemon: DaemonProc) -> cgroups.Cgroups:
    found = host_cgroups(daemon.cgroup_parent)
    assert found is not None, f"no cgroup parent {daemon.cgroup_parent} in the host's cgroup file system"
    return found


def entity(daemon: DaemonProc, claim: str) -> EntityInfo:
    with daemon.client() as c:
        return next(e for e in c.list(probe=True) if e.entity_id == claim)


@pytest.mark.root
@LAUNCHERS
def test_aclserver_runs_in_its_own_bounded_cgroup(make_daemon: MakeDaemon, launcher: str) -> None:
    daemon = make_daemon(extra=("--launcher", launcher, "--max-sessions", "4"))
    claim = uid()
    with daemon.client() as c:
        res = c.register(
            request(claim, share(2, mem_gib=0.5, compute=30), share(3, vid=1, mem_gib=0.25, compute=20))
        )
        health = c.health()
    cg = claim_cgroups(daemon)
    assert holds(cg, claim, res.pid), Path(f"/proc/{res.pid}/cgroup").read_text()
    assert res.pid in cg.members(claim) and cg.members(claim) == [res.pid]
    quota = (512 + 256) * MIB
    want = bounds.Bounds(
        memory_bytes=2 * quota + 4 * DEFAULT_STAGING_BYTES + bounds.DEFAULT_MEMORY_OVERHEAD_BYTES,
        tasks=bounds.BASE_TASKS + 4 * bounds.tasks_per_session(2),
        cpu_weight=50,
    )
    fig = cg.figures(claim)
    assert (fig.memory_max, fig.tasks_max, fig.cpu_weight) == (want.memory_bytes, want.tasks, 50)
    assert fig.tasks_current >= 1 and fig.memory_current > 0 and fig.oom_kills == 0
    info = entity(daemon, claim)
    assert info.cgroup == f"{daemon.cgroup_parent}/aclserver-{claim}"
    assert (info.memory_max_bytes, info.tasks_max, info.cpu_weight) == (want.memory_bytes, want.tasks, 50)
    assert info.memory_current_bytes > 0 and info.tasks_current >= 1
    assert daemon.cgroup_parent in health.cgroups and health.cgroup_problem == "" and health.adopted
    with daemon.client() as c:
        assert c.unregister(claim) is True
    assert gone(res.pid)
    assert not cg.exists(claim) and claim not in cg.claims()


@pytest.mark.root
def test_memory_bound_kills_only_that_aclserver_and_it_is_reported(
    make_daemon: MakeDaemon, tmp_path: Path
) -> None:
    leak_dir = tmp_path / "leak"
    leak_dir.mkdir()
    daemon = make_daemon(
        command=f"{sys.executable} {FAKE} --leak-if {leak_dir}",
        extra=("--max-sessions", "1", "--aclserver-memory-overhead-mib", "16"),
    )
    leaker, neighbour = uid(), uid()
    (leak_dir / leaker).touch()
    with daemon.client() as c:
        calm = c.register(request(neighbour, share(3, mem_gib=0.125)))
        first = c.register(request(leaker, share(2, mem_gib=0.125)))
        # It leaks until its cgroup's bound (128 + 128 + 8 + 16 MiB) stops it; restarted once, it leaks again.
        down = wait_for(
            lambda: next(
                (
                    e
                    for e in c.list()
                    if e.entity_id == leaker and e.restarts == 1 and e.state is EntityState.EXITED
                ),
                None,
            ),
            timeout=60,
            what="the leaking aclserver killed twice and left Exited",
        )
        assert "OOM killer" in down.message and "280 MiB" in down.message, down.message
        assert down.pid != first.pid
        assert daemon.proc is not None and daemon.proc.poll() is None  # the daemon lives
        assert ping_unix(calm.endpoints.unix_socket) == calm.pid  # the neighbour was not touched
        [again] = [e for e in c.list(probe=True) if e.entity_id == neighbour]
        assert (again.pid, again.state, again.oom_kills) == (calm.pid, EntityState.RUNNING, 0)
        [gone_one] = [e for e in c.list(probe=True) if e.entity_id == leaker]
        assert gone_one.oom_kills == 2 and gone_one.memory_max_bytes == 280 * MIB
        assert claim_cgroups(daemon).figures(leaker).oom_kills == 2  # the kernel's own count
        assert c.unregister(leaker) and c.unregister(neighbour)
    assert "killed by the kernel's OOM killer" in daemon.log()


@pytest.mark.root
def test_a_16_vnpu_claims_task_bound_is_sized_from_it_and_hitting_it_is_the_recorded_reason(
    make_daemon: MakeDaemon, tmp_path: Path
) -> None:
    """Issue 25 class 10: pids.max ignored the vNPU count (a 16-vNPU claim's session needs 81 tasks:
    its thread, 64 waiters, a kernel worker per vNPU), and an aclserver that hit it was recorded only
    as "exited". Here the claim's bound grows with its vNPUs, and an aclserver that starts threads
    until the kernel refuses one is recorded with its task bound as the reason; its neighbour lives."""
    threads_dir = tmp_path / "threads"
    threads_dir.mkdir()
    daemon = make_daemon(
        command=f"{sys.executable} {FAKE} --threads-if {threads_dir}",
        extra=("--max-sessions", "1", "--max-restarts", "0"),
    )
    greedy, neighbour = uid(), uid()
    (threads_dir / greedy).touch()
    sixteen = [share(i % 8, vid=i, mem_gib=0.125, compute=1) for i in range(16)]
    want = bounds.BASE_TASKS + 1 * (1 + bounds.WAITERS_PER_SESSION + 16)
    with daemon.client() as c:
        calm = c.register(request(neighbour, share(3, mem_gib=0.125)))
        c.register(request(greedy, *sixteen))
        down = wait_for(
            lambda: next(
                (
                    e
                    for e in c.list()
                    if e.entity_id == greedy and e.state is EntityState.EXITED and e.message
                ),
                None,
            ),
            timeout=60,
            what="the aclserver that started threads without end recorded as Exited",
        )
        assert (
            f"it hit its task bound (pids.max {want}, cgroup {daemon.cgroup_parent}/aclserver-{greedy}"
            in down.message
        ), down.message
        assert claim_cgroups(daemon).figures(greedy).tasks_max == want == 145
        assert ping_unix(calm.endpoints.unix_socket) == calm.pid
        assert c.unregister(greedy) and c.unregister(neighbour)


@pytest.mark.root
def test_cgroups_never_leak_over_cycles_and_daemon_restarts(make_daemon: MakeDaemon) -> None:
    daemon = make_daemon()
    held: dict[str, int] = {}
    for cycle in range(100):
        claim = uid()
        with daemon.client() as c:
            res = c.register(request(claim, share(cycle % 8, mem_gib=0.125, compute=1)))
            if cycle % 10 == 3:
                held[claim] = res.pid  # a few stay registered across the restarts
            elif cycle % 10 == 6:
                os.kill(res.pid, signal.SIGKILL)  # dies under the daemon: restarted, then unregistered
                wait_for(lambda c=claim: entity(daemon, c).restarts == 1, what="restarted once")
                assert c.unregister(claim)
            else:
                assert c.unregister(claim)
        if cycle % 25 == 24:  # the daemon goes (SIGKILL or SIGTERM) while claims live, and comes back
            daemon.stop(signal.SIGKILL if cycle % 50 == 24 else signal.SIGTERM)
            daemon.start()
        assert claim_cgroups(daemon).claims() == set(held) | ({claim} if claim in held else set())
    cg = claim_cgroups(daemon)
    assert cg.claims() == set(held)
    for claim, pid in held.items():
        assert holds(cg, claim, pid) and ping_unix(entity(daemon, claim).endpoints.unix_socket) == pid
    with daemon.client() as c:
        for claim in held:
            assert c.unregister(claim)
    assert cg.claims() == set()


@pytest.mark.root
def test_recovery_keeps_what_runs_in_unowned_cgroups_and_removes_only_its_empty_ones(
    make_daemon: MakeDaemon,
) -> None:
    """Issue 25 class 7: a process in a claim cgroup no entry owns is doubt, never killed; an empty
    cgroup goes when it is this daemon's (or carries no identity), another install's stays."""
    daemon = make_daemon()
    claim, stale, empty_ours, empty_theirs = uid(), uid(), uid(), uid()
    with daemon.client() as c:
        res = c.register(request(claim))
    cg = claim_cgroups(daemon)
    daemon.stop(signal.SIGKILL)
    procs = cg.create(stale, bounds.Bounds(64 * MIB, 16, 100))
    stray = subprocess.Popen(
        ["/bin/sh", "-c", 'for f; do echo $$ > "$f"; done; exec sleep 600', "join", *map(str, procs)]
    )
    try:
        wait_for(lambda: cg.members(stale) == [stray.pid], what="the stray process in the unowned cgroup")
        cg.create(empty_ours, bounds.Bounds(64 * MIB, 16, 100))  # no identity: made before there was one
        other = cgroups.Cgroups(cg.layout, cg.parent, owner="0123456789abcdef0123456789abcdef")
        other.create(empty_theirs, bounds.Bounds(64 * MIB, 16, 100))
        daemon.start()
        assert stray.poll() is None  # kept
        assert cg.claims() == {claim, stale, empty_theirs} and holds(cg, claim, res.pid)
        assert f"removed stale cgroup {daemon.cgroup_parent}/aclserver-{empty_ours}" in daemon.log()
        assert f"claim {stale}: pids [{stray.pid}]" in daemon.log()
        assert cg.owners(claim) == {(daemon.state_dir / "daemon.id").read_text().strip()}
    finally:
        stray.kill()
        stray.wait()
        other.remove(empty_theirs)


@pytest.mark.root
def test_a_second_install_on_the_host_leaves_the_firsts_aclservers_alive(make_daemon: MakeDaemon) -> None:
    """Issue 25 class 7 as reported: daemon B (its own state, run and shm dirs) under the same cgroup
    parent as daemon A killed A's aclserver at its start. Now it keeps it, says whose it is, and
    refuses to replace it; A goes on serving and unregisters it as usual."""
    a = make_daemon()
    claim = uid()
    with a.client() as c:
        res = c.register(request(claim))
    b = make_daemon(start=False)
    b.cgroup_parent = a.cgroup_parent
    b.start()
    assert ping_unix(res.endpoints.unix_socket) == res.pid
    assert holds(claim_cgroups(a), claim, res.pid)  # its cgroup kept, with it inside
    a_id = (a.state_dir / "daemon.id").read_text().strip()
    assert (
        f"claim {claim}: pids [{res.pid}] (cgroup {a.cgroup_parent}/aclserver-{claim}; another daemon's ({a_id}))"
        in b.log()
    )
    with b.client() as c, pytest.raises(StateError) as err:
        c.unregister(claim)
    assert "not replaced" in err.value.message and ping_unix(res.endpoints.unix_socket) == res.pid
    with a.client() as c:
        assert c.unregister(claim)
    assert gone(res.pid)


UNBOUNDED = [
    pytest.param("no-cgroup-fs", id="cgroup-root-without-cgroups"),
    pytest.param("read-only", id="cgroup-root-read-only"),
]
"""A daemon without write access to the cgroup file system. (Running it as another uid is not a
row: the test interpreter lives under root's 0700 home, which that uid cannot enter.)"""


@pytest.mark.root
@pytest.mark.parametrize("how", UNBOUNDED)
def test_without_cgroup_write_access_aclservers_run_unbounded_with_a_warning(
    make_daemon: MakeDaemon, tmp_path: Path, how: str
) -> None:
    daemon = make_daemon(start=False, extra=("--shm-mount", "never"))
    if how == "no-cgroup-fs":
        daemon.extra += ("--cgroup-root", str(tmp_path))
    else:  # a mount namespace of its own in which every cgroup hierarchy is read-only
        remount = (
            "for m in $(awk '$3 ~ /^cgroup/ {print $2}' /proc/mounts); do mount -o remount,bind,ro $m; done"
        )
        daemon.wrapper = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            f'{remount}; exec "$@"',
        ]
        daemon.wrapper.append("sh")
    daemon.start()
    claim = uid()
    with daemon.client() as c:
        health = c.health()
        res = c.register(request(claim))
        [info] = c.list(probe=True)
    assert health.cgroups == "" and health.cgroup_problem, health
    assert "unbounded" in daemon.log() and health.cgroup_problem in daemon.log()
    assert info.cgroup == "" and info.memory_max_bytes == -1 and info.state is EntityState.RUNNING
    assert ping_unix(res.endpoints.unix_socket) == res.pid
    assert host_cgroups(daemon.cgroup_parent) is None  # nothing was made
    with daemon.client() as c:
        assert c.unregister(claim)


def test_cgroups_always_refuses_to_start_without_them(make_daemon: MakeDaemon, tmp_path: Path) -> None:
    daemon = make_daemon(start=False, extra=("--cgroups", "always", "--cgroup-root", str(tmp_path)))
    with pytest.raises(AssertionError, match="daemon exited with 1"):
        daemon.start()
    assert "--cgroups always: no cgroup hierarchy is mounted" in daemon.log()
    assert str(ErrorCode.CGROUP_FAILED) in daemon.log()


@pytest.mark.root
def test_an_aclserver_that_cannot_join_its_cgroup_fails_the_register_naming_the_claim(
    make_daemon: MakeDaemon,
) -> None:
    daemon = make_daemon()
    cg = claim_cgroups(daemon)
    cpuset = next((h for h in cg.layout.hierarchies if "cpuset" in h.controllers), None)
    if cpuset is None:
        pytest.skip("no cgroup v1 cpuset hierarchy on this host (the failure is made with an empty cpuset)")
    mems = Path(cpuset.mount) / daemon.cgroup_parent / "cpuset.mems"
    before = mems.read_text().strip()
    claim = uid()
    mems.write_text("\n")  # no memory node: the kernel refuses to move a task in (ENOSPC)
    try:
        with daemon.client() as c, pytest.raises(StateError) as err:
            c.register(request(claim))
    finally:
        mems.write_text(before)
    assert err.value.claim_uid == claim and err.value.code == ErrorCode.CGROUP_FAILED, err.value
    assert "cgroup.procs" in str(err.value)
    with daemon.client() as c:
        assert c.list() == []  # nothing half-made stays
        other = c.register(request(uid()))  # and the daemon serves the next claim
        assert ping_unix(other.endpoints.unix_socket) == other.pid
    assert cg.claims() == {other.entity_id}
