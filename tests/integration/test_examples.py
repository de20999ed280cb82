"""The example folders under manifests/examples/ do what their READMEs promise.

For each example, the claims its Pods would get (a ResourceClaim per Pod claim, whose spec is
the template's ``spec.spec``, as the resourceclaim controller makes them) are created in the
fake API server, allocated by the scheduler simulator against the slices the real node process
publishes (daemon, ``both`` mode), and prepared through the kubelet simulator. The example's own
Namespace and DeviceClasses are created first. Where a README shows the probe's output, the
test runs the same probe (``flexnpu_client.probe``) against the prepared claim.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from dra_driver import wirefiles
from dra_kubeletplugin.claims import ClaimRef
from dra_kubeletplugin.claims import PrepareResult as ClaimResult
from flexnpu_client import probe
from flexnpu_client.session import Session
from flexnpu_testing.fake_apiserver import parse_quantity
from flexnpu_testing.scheduler import Unschedulable
from flexnpu_testing.waiting import wait_for
from flexnpu_wire import clientconf
from tests.integration.conftest import DRIVER, NODE, REPO, Node

EXAMPLES = REPO / "manifests" / "examples"
MI = 1024 * 1024
GI = 1024 * MI


@dataclasses.dataclass(frozen=True)
class PodClaim:
    """A claim as the resourceclaim controller would create it for one Pod claim entry."""

    namespace: str
    name: str  # <pod>-<claim entry>
    pod: str
    spec: dict[str, Any]


class Example:
    """One example folder installed into the fake API server of a node."""

    def __init__(self, node: Node, folder: str) -> None:
        self.node = node
        self.folder = folder
        self.docs = [d for d in yaml.safe_load_all((EXAMPLES / folder / f"{folder}.yaml").read_text()) if d]
        (self.namespace,) = [d["metadata"]["name"] for d in self.docs if d["kind"] == "Namespace"]
        self.uids: dict[str, str] = {}
        core: Any = client.CoreV1Api(node.api.api_client())  # the client's stubs want models, not dicts
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}})
        for doc in self.docs:
            if doc["kind"] == "DeviceClass":
                self.resource.create_device_class(doc)

    def pod_claims(self) -> dict[str, PodClaim]:
        """Claims of every Pod, by claim name, in document order."""
        templates = {
            d["metadata"]["name"]: d["spec"]["spec"]
            for d in self.docs
            if d["kind"] == "ResourceClaimTemplate"
        }
        out: dict[str, PodClaim] = {}
        for pod in (d for d in self.docs if d["kind"] == "Pod"):
            for entry in pod["spec"]["resourceClaims"]:
                name = f"{pod['metadata']['name']}-{entry['name']}"
                spec = templates[entry["resourceClaimTemplateName"]]
                out[name] = PodClaim(self.namespace, name, pod["metadata"]["name"], spec)
        return out

    @property
    def resource(self) -> Any:
        return self.node.resource

    def create(self, claim: PodClaim) -> str:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": claim.name, "namespace": claim.namespace},
            "spec": claim.spec,
        }
        raw = self.resource.create_namespaced_resource_claim(claim.namespace, body, _preload_content=False)
        uid: str = json.loads(raw.data)["metadata"]["uid"]
        self.uids[claim.name] = uid
        return uid

    def allocate(self, name: str) -> dict[str, Any]:
        """Allocate and reserve the claim for its Pod (the Pod itself is not created)."""
        pod = name.rsplit("-", 1)[0]
        consumer = {"resource": "pods", "name": pod, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, pod))}
        return self.node.scheduler.allocate(self.namespace, name, NODE, reserved_for=[consumer])

    def ref(self, name: str) -> ClaimRef:
        return ClaimRef(self.namespace, self.uids[name], name)

    def prepare(self, name: str) -> ClaimResult:
        assert self.node.kubelet is not None
        res = self.node.kubelet.prepare([self.ref(name)])[self.uids[name]]
        assert res.error == "", res.error
        return res

    def release(self, name: str) -> None:
        """What happens when the Pod is deleted: unprepare, then deallocate."""
        assert self.node.kubelet is not None
        assert self.node.kubelet.unprepare([self.ref(name)]) == {self.uids[name]: ""}
        self.node.scheduler.deallocate(self.namespace, name)

    def conf(self, name: str) -> clientconf.ClientConf:
        return wirefiles.load_client_conf(self.node.dirs["run"] / "claims" / self.uids[name] / "client.conf")

    def cdi_env(self, name: str) -> list[str]:
        spec = json.loads(next(p for p in self.node.cdi_specs() if self.uids[name] in p.name).read_text())
        env: list[str] = list(spec["containerEdits"].get("env") or [])
        for dev in spec["devices"]:
            env += dev["containerEdits"].get("env") or []
        return env

    def host_conf(self, name: str, tmp: Path) -> Path:
        """client.conf with the container paths mapped to host paths (as the CDI mounts map them)."""
        uid = self.uids[name]
        conf = self.conf(name)
        spec = json.loads(next(p for p in self.node.cdi_specs() if uid in p.name).read_text())
        shm = next(
            m["hostPath"] for m in spec["containerEdits"]["mounts"] if m["containerPath"] == conf.shm_dir
        )
        unix = str(Path(shm) / Path(conf.endpoints.unix).name) if conf.endpoints.unix else None
        mapped = dataclasses.replace(
            conf, shm_dir=shm, endpoints=clientconf.Endpoints(unix=unix, tcp=conf.endpoints.tcp)
        )
        path = tmp / f"{name}.conf"
        path.write_text(clientconf.render(mapped))
        return path

    def stored(self, name: str) -> dict[str, Any]:
        raw = self.resource.read_namespaced_resource_claim(name, self.namespace, _preload_content=False)
        doc: dict[str, Any] = json.loads(raw.data)
        return doc


def run_probe(conf: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    capsys.readouterr()
    assert probe.main(["--conf", str(conf)]) == 0, capsys.readouterr().err
    return capsys.readouterr().out.splitlines()


@pytest.fixture
def soft_node(node_factory: Callable[..., Node]) -> Node:
    n = node_factory(daemon=True, FLEXNPU_DEFAULT_MODE="both", FLEXNPU_DAEMON_RETRY_SECONDS="2").start()
    wait_for(n.devices, what="published devices")
    return n


def _results(alloc: dict[str, Any]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = alloc["status"]["allocation"]["devices"]["results"]
    return results


def _consumed(result: dict[str, Any]) -> dict[str, int]:
    """A result's consumedCapacity as integers (the scheduler formats them as it likes)."""
    return {k: int(parse_quantity(v)[0]) for k, v in result["consumedCapacity"].items()}


def _shares(conf: clientconf.ClientConf) -> list[tuple[int, int, int, str]]:
    return [(s.virtual_id, s.memory_bytes, s.compute_percent, str(s.policy)) for s in conf.shares]


def test_vnpu_share(soft_node: Node, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ex = Example(soft_node, "vnpu-share")
    (claim,) = ex.pod_claims().values()
    ex.create(claim)
    (result,) = _results(ex.allocate(claim.name))
    assert result["device"].startswith("vnpu-") and result["shareID"]
    assert _consumed(result) == {"memory": 4 * GI, "compute": 25, "shares": 1}
    (dev,) = ex.prepare(claim.name).devices
    conf = ex.conf(claim.name)
    assert _shares(conf) == [(0, 4 * GI, 25, "elastic")]
    assert conf.endpoints.unix == "/dev/shm/flexnpu/aclserver.sock"
    assert conf.endpoints.tcp and conf.endpoints.tcp.startswith("169.254.213.1:")
    assert f"FLEXNPU_VNPU_0={dev.device}" in ex.cdi_env(claim.name)
    out = run_probe(ex.host_conf(claim.name, tmp_path), capsys)
    assert out == [
        f"claim {ex.uids[claim.name]}: 1 vNPU(s) via unix",
        f"device 0: memory free={4 * GI} total={4 * GI}; malloc 1048576 ok; round trip ok",
    ]
    (status,) = ex.stored(claim.name)["status"]["devices"]
    assert status["data"]["memoryBytes"] == 4 * GI and status["data"]["computePercent"] == 25
    assert status["data"]["endpoint"] == conf.endpoints.tcp


def test_two_pods_one_die(soft_node: Node, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ex = Example(soft_node, "two-pods-one-die")
    claims = ex.pod_claims()
    assert [c.pod for c in claims.values()] == ["pod0", "pod1"]
    results = {}
    for claim in claims.values():
        ex.create(claim)
        (results[claim.name],) = _results(ex.allocate(claim.name))
    first, second = results.values()
    # One die, two shares: same device, different share IDs, and the die's compute is used up.
    assert first["device"] == second["device"] and first["shareID"] != second["shareID"]
    assert _consumed(first) == _consumed(second) == {"memory": 8 * GI, "compute": 50, "shares": 1}
    confs = {}
    for name in claims:
        (dev,) = ex.prepare(name).devices
        assert dev.device == first["device"]
        confs[name] = ex.conf(name)
        assert _shares(confs[name]) == [(0, 8 * GI, 50, "elastic")]
        assert f"FLEXNPU_VNPU_0={first['device']}" in ex.cdi_env(name)
        out = run_probe(ex.host_conf(name, tmp_path), capsys)
        assert out[1] == f"device 0: memory free={8 * GI} total={8 * GI}; malloc 1048576 ok; round trip ok"
    a, b = confs.values()
    assert a.token != b.token and a.endpoints.tcp != b.endpoints.tcp  # two aclservers
    # A third share of the same size no longer fits on that die: it goes to the next one.
    third = dataclasses.replace(next(iter(claims.values())), name="pod2-vnpu", pod="pod2")
    ex.create(third)
    (r3,) = _results(ex.allocate(third.name))
    assert r3["device"] != first["device"]


def test_equal_distribution(soft_node: Node, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ex = Example(soft_node, "equal-distribution")
    (claim,) = ex.pod_claims().values()
    ex.create(claim)
    results = _results(ex.allocate(claim.name))
    assert [_consumed(r) for r in results] == [{"memory": 256 * MI, "compute": 20, "shares": 1}]
    assert len(ex.prepare(claim.name).devices) == 1  # one share of the total, split by vnpus: 2
    assert _shares(ex.conf(claim.name)) == [(0, 128 * MI, 10, "elastic"), (1, 128 * MI, 10, "elastic")]
    assert "FLEXNPU_VISIBLE_VNPUS=0,1" in ex.cdi_env(claim.name)
    out = run_probe(ex.host_conf(claim.name, tmp_path), capsys)
    assert out == [
        f"claim {ex.uids[claim.name]}: 2 vNPU(s) via unix",
        f"device 0: memory free={128 * MI} total={128 * MI}; malloc 1048576 ok; round trip ok",
        f"device 1: memory free={128 * MI} total={128 * MI}; malloc 1048576 ok; round trip ok",
    ]


@pytest.mark.parametrize(
    "first",
    [pytest.param("pod-whole-npu", id="whole-first"), pytest.param("pod-share-vnpu", id="share-first")],
)
def test_whole_vs_shares(soft_node: Node, first: str) -> None:
    ex = Example(soft_node, "whole-vs-shares")
    claims = ex.pod_claims()
    assert sorted(claims) == ["pod-share-vnpu", "pod-whole-npu"]
    (second,) = set(claims) - {first}
    for claim in claims.values():
        ex.create(claim)
    expect = {"pod-whole-npu": "npu-0", "pod-share-vnpu": "vnpu-0"}
    (r1,) = _results(ex.allocate(first))
    assert r1["device"] == expect[first]
    ex.prepare(first)
    # The second claim stays pending while the first holds die 0: the counters say no.
    with pytest.raises(Unschedulable):
        ex.allocate(second)
    assert not ex.stored(second).get("status", {}).get("allocation")
    # The first Pod goes away: unprepared and deallocated; now the second one fits on die 0.
    ex.release(first)
    (r2,) = _results(ex.allocate(second))
    assert r2["device"] == expect[second]
    (dev,) = ex.prepare(second).devices
    assert dev.device == expect[second]
    # And now the first one is the one that waits.
    with pytest.raises(Unschedulable):
        ex.allocate(first)


def test_whole_vs_shares_counter_model(soft_node: Node) -> None:
    """The numbers the README explains: die-0's counters, and what each device consumes."""
    Example(soft_node, "whole-vs-shares")
    slices = soft_node.slices()
    sets = {c["name"]: c for s in slices for c in s["spec"].get("sharedCounters") or []}
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}
    die_memory = devices["npu-0"]["capacity"]["memory"]["value"]
    assert sets["die-0"]["counters"] == {"memory": {"value": die_memory}, "compute": {"value": "100"}}
    assert devices["npu-0"]["consumesCounters"] == [
        {"counterSet": "die-0", "counters": {"memory": {"value": die_memory}, "compute": {"value": "100"}}}
    ]
    assert devices["vnpu-0"]["consumesCounters"] == [
        {"counterSet": "die-0", "counters": {"memory": {"value": "1"}}}
    ]
    assert devices["vnpu-0"]["attributes"]["phyID"] == {"int": 0}


def test_policy_override(soft_node: Node, tmp_path: Path) -> None:
    ex = Example(soft_node, "policy-override")
    (claim,) = ex.pod_claims().values()
    ex.create(claim)
    alloc = ex.allocate(claim.name)
    (result,) = _results(alloc)
    assert result["device"].startswith("vnpu-") and result["device"].endswith("-fixed")
    config = alloc["status"]["allocation"]["devices"]["config"]
    params = [(c["source"], c["opaque"]["driver"], c["opaque"]["parameters"]) for c in config]
    assert [(src, drv, p.get("policy"), p.get("transport")) for src, drv, p in params] == [
        ("FromClass", DRIVER, "fixed", "unix"),
        ("FromClaim", DRIVER, None, "tcp"),
    ]
    ex.prepare(claim.name)
    conf = ex.conf(claim.name)
    assert _shares(conf) == [(0, 2 * GI, 20, "fixed")]
    assert conf.endpoints.unix is None and conf.endpoints.tcp  # the claim's transport won
    assert (
        '"policy": "fixed"'
        in (soft_node.dirs["run"] / "claims" / ex.uids[claim.name] / "client.conf").read_text()
    )
    (status,) = ex.stored(claim.name)["status"]["devices"]
    assert status["data"]["policy"] == "fixed"
    with Session.open(ex.host_conf(claim.name, tmp_path)) as s:
        s.init()
        s.set_device(0)
        assert s.get_mem_info()[1] == 2 * GI
    # Without the claim's override, the class config's transport holds (and the policy is the device's).
    ex.release(claim.name)
    plain = dataclasses.replace(
        claim, name="pod1-vnpu", pod="pod1", spec={"devices": {"requests": claim.spec["devices"]["requests"]}}
    )
    ex.create(plain)
    ex.allocate(plain.name)
    ex.prepare(plain.name)
    plain_conf = ex.conf(plain.name)
    assert _shares(plain_conf) == [(0, 2 * GI, 20, "fixed")] and plain_conf.endpoints.tcp is None


def test_extended_resource(node_factory: Callable[..., Node]) -> None:
    """The Pod of extended-resource/ asks ``flexnpu.io/npu: 1``: the chart's whole-die class serves it."""
    from flexnpu_testing import extended_resources
    from tests.integration.test_extended_resources import davinci_paths, install_chart_classes

    node = node_factory().start()
    wait_for(node.devices, what="published devices")
    ex = Example(node, "extended-resource")
    install_chart_classes(node)
    (pod,) = [d for d in ex.docs if d["kind"] == "Pod"]
    core: Any = node.api_core()
    core.create_namespaced_pod(ex.namespace, pod)
    claim = node.scheduler.schedule_pod(ex.namespace, "pod0", NODE)
    assert claim is not None and claim["metadata"]["name"].startswith("pod0-extended-resources-")
    (result,) = _results(claim)
    assert result["device"].startswith("npu-")
    raw = core.read_namespaced_pod("pod0", ex.namespace, _preload_content=False)
    status = json.loads(raw.data)["status"]["extendedResourceClaimStatus"]
    assert status["requestMappings"] == [
        {"containerName": "ctr0", "requestName": "container-0-request-0", "resourceName": "flexnpu.io/npu"}
    ]
    (ref,) = extended_resources.pod_claim_refs(node.api.api_client(), ex.namespace, "pod0")
    assert ref.name == status["resourceClaimName"]
    assert node.kubelet is not None
    res = node.kubelet.prepare([ref])[ref.uid]
    assert res.error == "" and [d.device for d in res.devices] == [result["device"]]
    (spec_path,) = [p for p in node.cdi_specs() if ref.uid in p.name]
    assert davinci_paths(spec_path) == [f"/dev/davinci{result['device'].removeprefix('npu-')}"]
    # Cleanup as the README says: the Pod goes, the kubelet unprepares, the claim is collected.
    assert node.kubelet.unprepare([ref]) == {ref.uid: ""}
    core.delete_namespaced_pod("pod0", ex.namespace)
    assert not ex.resource.list_namespaced_resource_claim(ex.namespace).items
