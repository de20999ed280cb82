"""Two daemon instances on one node (a rolling update, a surge, one started by hand): only one adopts.

Real daemons on the same state directory, socket and cgroups; the readiness probe as the chart runs it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator

import pytest

from dra_driver.daemon import instance
from dra_driver.testing.daemon import DaemonProc, ping_unix, request, share
from dra_driver.testing.waiting import wait_for

pytestmark = pytest.mark.root

MakeDaemon = Callable[..., DaemonProc]


@pytest.fixture
def make_daemon() -> Iterator[MakeDaemon]:
    made: list[DaemonProc] = []

    def make(**kwargs: object) -> DaemonProc:
        d = DaemonProc(**kwargs)  # type: ignore[arg-type]
        made.append(d)
        return d

    yield make
    for d in reversed(made):  # a later instance first: it would restart what an earlier cleanup kills
        d.cleanup()


def ready_probe(daemon: DaemonProc, name: str) -> subprocess.CompletedProcess[str]:
    """``python3 -m dra_driver.probes daemon-ready`` in the environment the chart gives instance ``name``."""
    env = dict(os.environ, FLEXNPU_DAEMON_SOCKET=str(daemon.socket), FLEXNPU_DAEMON_INSTANCE=name)
    return subprocess.run(
        [sys.executable, "-m", "dra_driver.probes", "daemon-ready"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_second_instance_waits_for_the_lock_then_adopts_the_same_aclservers(make_daemon: MakeDaemon) -> None:
    old = make_daemon(extra=("--instance", "old-pod"))
    old.start()
    claim = str(uuid.uuid4())
    with old.client() as c:
        res = c.register(request(claim, share(2)))
    assert ready_probe(old, "old-pod").returncode == 0

    new = make_daemon(extra=("--instance", "new-pod"), same_node_as=old)
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
    first.start()
    second = make_daemon(same_node_as=first)
    second.start(wait=False)
    wait_for(lambda: "another daemon instance holds it" in second.log(), what="the second instance waiting")
    assert second.stop(signal.SIGTERM) == 0
    assert "stopped before this instance got" in second.log()
    with first.client() as c:
        assert c.health().ok  # the holder was not disturbed
