"""Readiness means serving: the plugin's readiness probe (``python3 -m dra_driver.probes plugin``, as the chart
runs it) passes only once the kubelet registered the instance and a complete pool is published, and says which is
missing until then. Real node process, real kubelet-registration gRPC, the fake API server down and up."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable

from dra_driver import readiness
from flexnpu_testing.fake_apiserver import FakeAPIServer
from flexnpu_testing.kubelet import KubeletSimulator
from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import DRIVER, Node


def probe(node: Node) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_driver.probes", "plugin"],
        env=node.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_ready_only_after_registration_and_a_complete_publish(
    api: FakeAPIServer, node_factory: Callable[..., Node]
) -> None:
    node = node_factory()
    api.set_down(True)  # nothing can be published
    with node.log_file.open("ab") as out:
        node.proc = subprocess.Popen(
            [sys.executable, "-m", "kubeletplugin.cli", "plugin"],
            env=node.env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    ready_file = readiness.path_for(node.dirs["run"], None)
    wait_for(ready_file.exists, what="the readiness record", timeout=30)

    first = probe(node)
    assert first.returncode == 1
    assert (
        "is not ready: the kubelet has not registered it and no complete pool has been published yet"
        in first.stderr
    )

    node.kubelet = KubeletSimulator(node.dirs["registry"]).wait_for_plugin(DRIVER, timeout=30)  # registers
    wait_for(
        lambda: (
            (p := probe(node)).returncode == 1
            and "not registered" not in p.stderr
            and "is not ready: no complete pool has been published yet" in p.stderr
        ),
        what="registration recorded",
        timeout=30,
    )

    api.set_down(False)
    ok = wait_for(lambda: (p := probe(node)).returncode == 0 and p, what="ready", timeout=60)
    assert "registered, pool published" in ok.stdout
    assert node.devices(), "ready, yet no complete pool in the API"

    assert node.stop(signal.SIGTERM) == 0
    assert not ready_file.exists()  # a stopped instance leaves no stale "ready"
    assert probe(node).returncode == 1
