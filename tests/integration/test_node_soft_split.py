"""Soft-split shares end to end through the real node process, daemon and aclservers."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra_driver import wirefiles
from dra_driver.checkpoint import CheckpointStore
from dra_driver.sharing import API_VERSION
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_client.errors import AclError
from flexnpu_client.session import Session
from flexnpu_testing.waiting import wait_for
from flexnpu_wire import clientconf
from flexnpu_wire.codes import ACL_ERROR_RT_MEMORY_ALLOCATION
from tests.integration.conftest import DRIVER, NAMESPACE, NODE, Node
from tests.integration.daemon_harness import hello_tcp

MI = 1024 * 1024


def _share_request(
    name: str = "vnpu",
    memory: str = "256Mi",
    compute: str = "30",
    count: int = 1,
    cls: str = "vnpu.flexnpu.io",
) -> dict[str, Any]:
    return {
        "name": name,
        "exactly": {
            "deviceClassName": cls,
            "count": count,
            "capacity": {"requests": {"memory": memory, "compute": compute}},
        },
    }


def _vnpu_config(**fields: str) -> dict[str, Any]:
    return {
        "opaque": {
            "driver": DRIVER,
            "parameters": {"apiVersion": API_VERSION, "kind": "VnpuConfig", **fields},
        }
    }


@pytest.fixture
def soft_node(node_factory: Callable[..., Node]) -> Node:
    n = node_factory(daemon=True, FLEXNPU_DEFAULT_MODE="both", FLEXNPU_DAEMON_RETRY_SECONDS="2").start()
    wait_for(n.devices, what="published devices")
    return n


def _prepare(
    node: Node, name: str, requests: list[dict[str, Any]], config: list[dict[str, Any]] | None = None
) -> tuple[str, Any]:
    uid = node.create_claim(name, requests, config)
    node.scheduler.allocate(NAMESPACE, name, NODE)
    assert node.kubelet is not None
    return uid, node.kubelet.prepare([ClaimRef(NAMESPACE, uid, name)])[uid]


def _host_session(node: Node, uid: str, *, prefer: str = "unix") -> Session:
    """Connect like the container would, with container paths mapped to their host paths."""
    conf_file = node.dirs["run"] / "claims" / uid / "client.conf"
    conf = wirefiles.load_client_conf(conf_file)
    spec = json.loads(next(p for p in node.cdi_specs() if uid in p.name).read_text())
    shm_host = next(
        m["hostPath"] for m in spec["containerEdits"]["mounts"] if m["containerPath"] == "/dev/shm/flexnpu"
    )
    unix = str(Path(shm_host) / Path(conf.endpoints.unix).name) if conf.endpoints.unix else None
    host_conf = dataclasses.replace(
        conf, shm_dir=shm_host, endpoints=clientconf.Endpoints(unix=unix, tcp=conf.endpoints.tcp)
    )
    return Session.open(host_conf, prefer=prefer)


def test_share_prepared_served_and_released(soft_node: Node) -> None:
    n = soft_node
    uid, res = _prepare(
        n,
        "s1",
        [_share_request(memory="256Mi", compute="30", cls="vnpu-fixed.flexnpu.io")],
        [_vnpu_config(policy="fixed")],
    )
    assert res.error == ""
    (dev,) = res.devices
    assert dev.device.startswith("vnpu-") and dev.share_id
    # CDI: client.conf read-only, shm dir read-write, FLEXNPU_CONF, and no device node
    (spec_file,) = n.cdi_specs()
    spec = json.loads(spec_file.read_text())
    assert spec["cdiVersion"] <= "0.5.0"
    edits = spec["containerEdits"]
    assert "FLEXNPU_CONF=/etc/flexnpu/client.conf" in edits["env"]
    mounts = {m["containerPath"]: m for m in edits["mounts"]}
    assert "ro" in mounts["/etc/flexnpu/client.conf"]["options"]
    assert "rw" in mounts["/dev/shm/flexnpu"]["options"]
    assert "deviceNodes" not in edits and all(
        "deviceNodes" not in d["containerEdits"] for d in spec["devices"]
    )
    conf_path = Path(mounts["/etc/flexnpu/client.conf"]["hostPath"])
    assert conf_path.stat().st_mode & 0o777 == 0o644
    conf = wirefiles.load_client_conf(conf_path)
    assert [(s.virtual_id, s.memory_bytes, s.compute_percent, str(s.policy)) for s in conf.shares] == [
        (0, 256 * MI, 30, "fixed")
    ]
    # the control link: the aclserver answers on the link address from client.conf
    assert conf.endpoints.tcp and conf.endpoints.tcp.startswith("169.254.213.1:")
    host, port = conf.endpoints.tcp_address or ("", 0)
    assert hello_tcp(host, port, conf.token) > 0
    # the client inside its quota, and refused beyond it
    with _host_session(n, uid) as s:
        s.init()
        s.set_device(0)
        _free, total = s.get_mem_info()
        assert total == 256 * MI
        ptr = s.malloc(128 * MI)
        with pytest.raises(AclError) as info:
            s.malloc(200 * MI)
        assert info.value.ret == ACL_ERROR_RT_MEMORY_ALLOCATION
        s.free(ptr)
    # claim status: Ready, endpoint, networkData
    claim = json.loads(
        n.resource.read_namespaced_resource_claim("s1", NAMESPACE, _preload_content=False).data
    )
    (st,) = claim["status"]["devices"]
    assert (st["driver"], st["pool"], st["device"], st["shareID"]) == (DRIVER, NODE, dev.device, dev.share_id)
    assert st["conditions"][0]["type"] == "Ready" and st["conditions"][0]["status"] == "True"
    assert st["data"]["endpoint"] == conf.endpoints.tcp and st["data"]["policy"] == "fixed"
    assert st["networkData"]["ips"] == ["169.254.213.1/24"]

    shm_dir = Path(mounts["/dev/shm/flexnpu"]["hostPath"])
    assert n.kubelet is not None
    assert n.kubelet.unprepare([ClaimRef(NAMESPACE, uid, "s1")]) == {uid: ""}
    assert n.cdi_specs() == [] and not conf_path.exists() and not shm_dir.exists()
    assert n.daemon is not None
    assert wait_for(lambda: not n.daemon.aclserver_pids(), what="aclserver gone")
    claim = json.loads(
        n.resource.read_namespaced_resource_claim("s1", NAMESPACE, _preload_content=False).data
    )
    assert not claim["status"].get("devices")
    assert CheckpointStore(n.dirs["state"] / "checkpoint.json").read().claims == {}


def test_two_vnpus_equal_distribution(soft_node: Node) -> None:
    """2 vNPUs from 256 MiB and 20 % → 128 MiB and 10 % each, numbered 0 and 1 in the container."""
    uid, res = _prepare(soft_node, "eq", [_share_request(memory="128Mi", compute="10", count=2)])
    assert res.error == "" and len(res.devices) == 2
    conf = wirefiles.load_client_conf(soft_node.dirs["run"] / "claims" / uid / "client.conf")
    assert [(s.virtual_id, s.memory_bytes, s.compute_percent) for s in conf.shares] == [
        (0, 128 * MI, 10),
        (1, 128 * MI, 10),
    ]
    with _host_session(soft_node, uid) as s:
        s.init()
        assert s.get_device_count() == 2


def test_whole_die_and_shares_exclude_each_other(soft_node: Node) -> None:
    _uid, res = _prepare(soft_node, "s1", [_share_request()])
    assert res.error == ""
    die = res.devices[0].device.split("-")[1]
    # a hand-written allocation of the same die, whole, as a broken scheduler would send
    w_uid = soft_node.create_claim("w1", [{"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}])
    body = {"status": {"allocation": {"devices": {"results": [
        {"request": "npu", "driver": DRIVER, "pool": NODE, "device": f"npu-{die}"}], "config": []}}}}  # fmt: skip
    soft_node.resource.patch_namespaced_resource_claim_status("w1", NAMESPACE, body)
    assert soft_node.kubelet is not None
    bad = soft_node.kubelet.prepare([ClaimRef(NAMESPACE, w_uid, "w1")])[w_uid]
    assert "DeviceBusy" in bad.error and "as shares" in bad.error


@pytest.mark.parametrize(
    ("config", "field"),
    [
        pytest.param([_vnpu_config(polcy="fixed")], "polcy", id="unknown-field"),
        pytest.param([_vnpu_config(policy="greedy")], "policy", id="unknown-policy"),
        pytest.param(
            [
                {
                    "opaque": {
                        "driver": DRIVER,
                        "parameters": {"apiVersion": API_VERSION, "kind": "VnpuConfig", "policy": 5},
                    }
                }
            ],
            "policy",
            id="wrong-type",
        ),
    ],
)
def test_bad_opaque_config_fails_that_claim_only(
    soft_node: Node, config: list[dict[str, Any]], field: str
) -> None:
    uid, res = _prepare(soft_node, "bad", [_share_request()], config)
    assert "InvalidOpaqueConfig" in res.error and field in res.error and uid in res.error
    # kubectl describe shows why: Ready=False with the error code as the reason
    claim = json.loads(
        soft_node.resource.read_namespaced_resource_claim("bad", NAMESPACE, _preload_content=False).data
    )
    (cond,) = claim["status"]["devices"][0]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Ready", "False", "InvalidOpaqueConfig")
    assert field in cond["message"]
    assert soft_node.cdi_specs() == []
    assert soft_node.daemon is not None and not soft_node.daemon.aclserver_pids()
    _other_uid, ok = _prepare(
        soft_node,
        "good",
        [_share_request()],
        [{"opaque": {"driver": "other.example.com", "parameters": {"x": 1}}}],
    )
    assert ok.error == "", ok.error  # another driver's config is not ours to judge


def test_two_policies_never_meet_on_one_die(soft_node: Node) -> None:
    """The scheduler decides (tests/integration/test_share_policies.py has the guard and the waits)."""
    _uid1, r1 = _prepare(soft_node, "p1", [_share_request(cls="vnpu-fixed.flexnpu.io")])
    assert r1.error == ""
    die = r1.devices[0].device.removesuffix("-fixed")
    wait_for(
        lambda: any(d["name"] == die and d.get("taints") for d in soft_node.devices()),
        what="the die's elastic device withheld",
    )
    _uid2, r2 = _prepare(soft_node, "p2", [_share_request()], [_vnpu_config(policy="elastic")])
    assert r2.error == "" and r2.devices[0].device != die


@pytest.mark.parametrize(
    ("consumed", "expect"),
    [
        pytest.param({"memory": "100Mi", "compute": "10"}, "128Mi", id="not-128mi-multiple"),
        pytest.param({"compute": "10"}, "consumedCapacity.memory", id="memory-missing"),
        pytest.param({"memory": "64Gi", "compute": "10"}, "more than the die", id="more-than-the-die"),
    ],
)
def test_bad_consumed_capacity_is_refused(soft_node: Node, consumed: dict[str, str], expect: str) -> None:
    uid = soft_node.create_claim("q", [_share_request()])
    result = {"request": "vnpu", "driver": DRIVER, "pool": NODE, "device": "vnpu-3",
              "shareID": "5d4f4a8e-0000-4000-8000-000000000001", "consumedCapacity": consumed}  # fmt: skip
    body = {"status": {"allocation": {"devices": {"results": [result], "config": []}}}}
    soft_node.resource.patch_namespaced_resource_claim_status("q", NAMESPACE, body)
    assert soft_node.kubelet is not None
    res = soft_node.kubelet.prepare([ClaimRef(NAMESPACE, uid, "q")])[uid]
    assert "QuotaInvalid" in res.error and expect in res.error, res.error
    assert soft_node.cdi_specs() == []
    assert soft_node.daemon is not None and not soft_node.daemon.aclserver_pids()


def test_daemon_unreachable_fails_after_retries_and_leaves_nothing(soft_node: Node) -> None:
    assert soft_node.daemon is not None
    soft_node.daemon.stop()
    uid, res = _prepare(soft_node, "nd", [_share_request()])
    assert "DaemonUnavailable" in res.error and uid in res.error
    assert soft_node.cdi_specs() == []
    assert CheckpointStore(soft_node.dirs["state"] / "checkpoint.json").read().claims == {}
    assert not (soft_node.dirs["run"] / "claims" / uid).exists()
