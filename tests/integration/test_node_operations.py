"""The node process's operational behaviour: start-up failures, metrics, API feature fallbacks."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from dra_driver import netlink
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_testing.scheduler import Unschedulable
from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import INVENTORIES, NAMESPACE, NODE, Node


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param(
            {"FLEXNPU_CONTROL_LINK_KIND": "bridge"},
            "already exists and is a tun link",
            id="link-of-another-kind",
        ),
        pytest.param({"FLEXNPU_CONTROL_LINK_CIDR": "300.1.1.1/24"}, "control-link-cidr", id="bad-cidr"),
        pytest.param(
            {"FLEXNPU_CONTROL_LINK": "a-name-far-too-long"}, "not a valid interface name", id="bad-name"
        ),
        pytest.param({"FLEXNPU_DEFAULT_MODE": "half"}, "default-mode", id="bad-mode"),
    ],
)
def test_bad_start_configuration_is_a_clear_error_not_a_hang(
    node_factory: Callable[..., Node], env: dict[str, str], message: str
) -> None:
    n = node_factory(**env)
    if "FLEXNPU_CONTROL_LINK_KIND" in env:  # the link name is taken by a tap
        netlink.ensure_link(netlink.LinkSpec(name=n.env["FLEXNPU_CONTROL_LINK"], kind="tap"))
    proc = subprocess.run(
        [sys.executable, "-m", "kubeletplugin.cli", "plugin"],
        env=n.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stdout + proc.stderr
    assert not list(n.dirs["registry"].iterdir())  # it never registered with the kubelet


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_are_exported_for_prometheus(node_factory: Callable[..., Node]) -> None:
    port = _free_port()
    n = node_factory(FLEXNPU_METRICS_PORT=str(port)).start()
    wait_for(n.devices, what="published devices")
    uid = n.create_claim("m1", [{"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}])
    n.scheduler.allocate(NAMESPACE, "m1", NODE)
    assert n.kubelet is not None
    assert n.kubelet.prepare([ClaimRef(NAMESPACE, uid, "m1")])[uid].error == ""
    bad = n.kubelet.prepare([ClaimRef(NAMESPACE, "0000aaaa-0000-4000-8000-000000000000", "missing")])
    assert bad["0000aaaa-0000-4000-8000-000000000000"].error
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]

    def value(name: str, *labels: str) -> float:
        found = [ln for ln in lines if ln.startswith(name + "{") and all(lb in ln for lb in labels)]
        assert found, f"no {name} {labels} in /metrics"
        return float(found[0].rsplit(" ", 1)[1])

    assert value("flexnpu_dra_prepare_requests_total", 'result="success"', f'node="{NODE}"') == 1
    assert value("flexnpu_dra_prepare_requests_total", 'result="error"', 'error_type="ClaimNotFound"') == 1
    assert value("flexnpu_dra_prepared_vnpus", 'mode="whole"') == 1
    assert value("flexnpu_dra_operations_in_flight", 'operation="prepare"') == 0


def test_dropped_counter_fields_fall_back_to_one_mode_per_die(node_factory: Callable[..., Node]) -> None:
    """An API server with DRAPartitionableDevices off drops the counters: never publish whole+share on a die."""
    n = node_factory(FLEXNPU_DEFAULT_MODE="both")
    n.api.drop_partitionable_fields = True
    n.start()

    def fell_back() -> bool:
        slices = n.slices()
        names = sorted(d["name"] for s in slices for d in s["spec"].get("devices") or [])
        counters = [c for s in slices for c in s["spec"].get("sharedCounters") or []]
        return bool(names) and not counters and names == ["npu-0", "npu-1"]

    wait_for(fell_back, what="a pool without counters, whole dies only")
    wait_for(lambda: "one mode only" in n.log(), what="the warning in the log")


def test_health_change_is_republished_and_streamed_to_the_kubelet(
    node_factory: Callable[..., Node], tmp_path: Path
) -> None:
    source = (INVENTORIES / "a3-one-module.yaml").read_text()
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(source)
    n = node_factory(FLEXNPU_INVENTORY=str(inventory), FLEXNPU_REDISCOVER_SECONDS="0.3").start()
    wait_for(n.devices, what="published devices")
    assert n.kubelet is not None
    watch = n.kubelet.watch_health()
    try:
        first = watch.next(timeout=10)
        assert {(d.device, d.healthy) for d in first.devices} >= {("npu-1", True), ("vnpu-1", True)}
        inventory.write_text(
            source.replace(
                '      - busId: "0000:9F:00.0"', '      - busId: "0000:9F:00.0"\n        health: Unhealthy'
            )
        )

        def npu1_unhealthy() -> bool:
            devices = {d["name"]: d for d in n.devices()}
            return "npu-1" in devices and devices["npu-1"]["attributes"]["healthy"] == {"bool": False}

        wait_for(npu1_unhealthy, what="npu-1 republished as unhealthy")
        devices = {d["name"]: d for d in n.devices()}
        assert (
            devices["npu-0"]["attributes"]["healthy"] == {"bool": True} and "taints" not in devices["npu-0"]
        )
        assert [t["key"] for t in devices["npu-1"]["taints"]] == ["npu.flexnpu.io/unhealthy"]
        # the scheduler keeps new claims off the tainted die: two whole dies asked, one fits
        n.create_claim("w0", [{"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}])
        got = n.scheduler.allocate(NAMESPACE, "w0", NODE)["status"]["allocation"]["devices"]["results"]
        assert [r["device"] for r in got] == ["npu-0"]
        n.create_claim("w1", [{"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}])
        with pytest.raises(Unschedulable):
            n.scheduler.allocate(NAMESPACE, "w1", NODE)

        def streamed() -> bool:
            update = watch.next(timeout=10)
            return ("npu-1", False) in {(d.device, d.healthy) for d in update.devices}

        wait_for(streamed, what="the kubelet told that npu-1 is unhealthy", timeout=30)
    finally:
        watch.close()
