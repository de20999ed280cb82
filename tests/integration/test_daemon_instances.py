"""Two daemon instances on one node (a rolling update, a surge, one started by hand): only one adopts.

Real daemons on the same state directory, socket and cgroups; the readiness probe as the chart runs it.
"""

from __future__ import annotations

import signal
import subprocess
import uuid

import pytest

from flexnpu_runtime.daemon import instance
from flexnpu_testing.daemon import DaemonProc, ping_unix, request, share
from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import MakeDaemon


def ready_probe(daemon: DaemonProc, name: str) -> subprocess.CompletedProcess[str]:
    """The readiness probe as the chart runs it in instance ``name``'s container."""
    return daemon.probe("daemon-ready", instance=name)


def test_second_instance_waits_for_the_lock_then_adopts_the_same_aclservers(make_daemon: MakeDaemon) -> None:
    old = make_daemon(extra=("--instance", "old-pod"))
    claim = str(uuid.uuid4())
    with old.client() as c:
        res = c.register(request(claim, share(2)))
    assert ready_probe(old, "old-pod").returncode == 0

    new = make_daemon(extra=("--instance", "new-pod"), same_node_as=old, start=False)
    new.start(wait=False)
    wait_for(
        lambda: "another daemon instance holds it" in new.log(), what="the new instance waiting for the lock"
    )
    assert "pid" in instance.holder(old.state_dir / "daemon.lock") and "old-pod" in instance.holder(
        old.state_dir / "daemon.lock"
    )
    # It neither adopts nor serves: the socket is the old one's, and this pod is not ready.
    probe = ready_probe(new, "new-pod")
    assert probe.returncode == 1 and "is instance old-pod, not this one (new-pod)" in probe.stderr, (
        probe.stderr
    )
    assert "recovered" not in new.log()
    with old.client() as c:
        assert c.health().instance == "old-pod"

    old.stop(signal.SIGTERM)  # the DaemonSet takes the old pod down: its aclservers stay
    wait_for(lambda: ready_probe(new, "new-pod").returncode == 0, what="the new instance ready", timeout=30)
    assert "recovered: adopted 1" in new.log()
    with new.client() as c:
        [ent] = c.list()
        assert (ent.entity_id, ent.pid) == (claim, res.pid)
        assert c.health().instance == "new-pod"
    assert ping_unix(res.endpoints.unix_socket) == res.pid
    assert "Traceback" not in old.log() + new.log()


def test_a_waiting_instance_stops_cleanly_on_sigterm(make_daemon: MakeDaemon) -> None:
    first = make_daemon()
    second = make_daemon(same_node_as=first, start=False)
    second.start(wait=False)
    wait_for(lambda: "another daemon instance holds it" in second.log(), what="the second instance waiting")
    assert second.stop(signal.SIGTERM) == 0
    assert "stopped before this instance got" in second.log()
    with first.client() as c:
        assert c.health().ok  # the holder was not disturbed


@pytest.mark.root
def test_another_namespaces_aclservers_are_never_taken_for_orphans(make_daemon: MakeDaemon) -> None:
    """With hostPID a daemon sees every container's processes. Another daemon whose run dir reads the
    same path in its own mount namespace (another installation, a test node) is not this one's: its
    aclservers are left alone when this daemon recovers."""
    mine = make_daemon()
    own = str(uuid.uuid4())
    with mine.client() as c:
        own_pid = c.register(request(own, share(2))).pid
    other = make_daemon(start=False)
    same_path = mine.run_dir  # the other daemon's run dir is another directory mounted at this path
    other.run_dir.mkdir(parents=True, exist_ok=True)
    other.wrapper = [
        "unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
        f'mkdir -p {same_path} && mount --bind {other.run_dir} {same_path} && exec "$@"', "sh",
    ]  # fmt: skip
    other.extra += ("--run-dir", str(same_path), "--shm-mount", "never")  # its own mount namespace
    other.start()
    theirs = str(uuid.uuid4())
    with other.client() as c:
        res = c.register(request(theirs, share(3)))
    assert f"--spec {same_path}/aclservers/{theirs}.spec.json" in " ".join(processes_cmdline(res.pid))
    mine.stop(signal.SIGKILL)
    mine.start()  # recovery looks for its orphans by their command lines
    assert "recovered: adopted 1, removed 0, kept 0 live aclservers no entry owns" in mine.log()
    assert ping_unix(res.endpoints.unix_socket) == res.pid
    with mine.client() as c:
        assert [e.pid for e in c.list()] == [own_pid]
    with other.client() as c:
        assert c.unregister(theirs)


def processes_cmdline(pid: int) -> tuple[str, ...]:
    from flexnpu_runtime.daemon import processes

    return processes.cmdline(pid) or ()
