"""Placement policies end to end on the fake API server: the node's watch-driven reorder of its slices,
the scheduler extender's prioritize answers (HTTPS, k8s.io/kube-scheduler/extender/v1 JSON) and the
fake kube-scheduler calling it, and a down extender not keeping pods pending."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from dra_driver.devices import DieMode
from dra_driver.placement import ANNOTATION, Placement
from flexnpu_testing.cluster import ExtenderClient, ExtenderSpec, Unschedulable
from flexnpu_testing.placement_cluster import DRIVER, NAMESPACE, PlacementCluster, make_cert
from flexnpu_testing.telemetry import record_spans
from flexnpu_testing.waiting import wait_for
from kubeletplugin.ordering import PlacementCollector


def published_shares(c: PlacementCluster, node: str) -> list[str]:
    """The node's elastic share devices in the order its stored slices list them."""
    items, _ = c._kubes[0].list_slices(driver=DRIVER, node=node)
    names = [
        d["name"]
        for s in sorted(items, key=lambda s: s["metadata"]["name"])
        for d in s["spec"].get("devices") or []
    ]
    return [n for n in names if n.startswith("vnpu-") and n.count("-") == 1]


def seen_by_scheduler(c: PlacementCluster, node: str) -> list[str]:
    """The node's elastic share devices in order, as the fake scheduler's informer holds them."""
    items = [s for s in c.scheduler.slices.items() if s["spec"].get("nodeName") == node]
    names = [
        d["name"]
        for s in sorted(items, key=lambda s: s["metadata"]["name"])
        for d in s["spec"].get("devices") or []
    ]
    return [n for n in names if n.startswith("vnpu-") and n.count("-") == 1]


def allocate_on(c: PlacementCluster, claim: str, node: str, device: str, compute: str = "50") -> None:
    """Write an allocation as a scheduler would (the node must see it through its watch, nothing else)."""
    resource = kubernetes.client.ResourceV1Api(c.server.api_client())
    c.share_pod(claim.removesuffix("-claim"))
    stored = resource.read_namespaced_resource_claim(claim, NAMESPACE)
    body = c.server.api_client().sanitize_for_serialization(stored)
    body["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "npu", "driver": DRIVER, "pool": node, "device": device,
                                      "shareID": str(uuid.uuid4()),
                                      "consumedCapacity": {"compute": compute, "memory": "128Mi", "shares": "1"}}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        }
    }  # fmt: skip
    resource.replace_namespaced_resource_claim_status(claim, NAMESPACE, body)


@pytest.fixture
def binpack_node(tmp_path: Path) -> Iterator[PlacementCluster]:
    with PlacementCluster(tmp_path, nodes=1, policy=Placement.BINPACK, extender=False) as c:
        yield c


def test_an_allocation_seen_by_the_watch_reorders_the_slices(binpack_node: PlacementCluster) -> None:
    c = binpack_node
    assert published_shares(c, "node-00")[:2] == ["vnpu-7", "vnpu-6"]  # the empty node's order
    allocate_on(c, "a-claim", "node-00", "vnpu-3")
    wait_for(lambda: published_shares(c, "node-00")[0] == "vnpu-3", what="die 3 listed first (binpack)")
    assert published_shares(c, "node-00")[1:3] == ["vnpu-7", "vnpu-6"]
    kubernetes.client.ResourceV1Api(c.server.api_client()).delete_namespaced_resource_claim(
        "a-claim", NAMESPACE
    )
    wait_for(lambda: published_shares(c, "node-00")[0] == "vnpu-7", what="the empty order again")
    assert c.nodes["node-00"].ordering.republishes == 2


def test_an_allocation_that_keeps_the_order_writes_nothing(binpack_node: PlacementCluster) -> None:
    c = binpack_node
    node = c.nodes["node-00"]
    allocate_on(c, "b-claim", "node-00", "vnpu-7", compute="25")  # the first die already: same order
    wait_for(lambda: node.ordering.unchanged >= 1, what="the change seen and found to keep the order")
    assert node.ordering.republishes == 0 and published_shares(c, "node-00")[0] == "vnpu-7"


def test_binpack_filling_a_die_keeps_the_published_order_and_places_as_the_policy(tmp_path: Path) -> None:
    """Mode ``all``: once die 7 is full, binpack's order would list it last; the published order
    (die 7 first) is first-fit equivalent (the vnpus counter keeps its other share devices, whole
    device and templates off), so nothing is written, and the next share still lands on die 6."""
    with PlacementCluster(tmp_path, nodes=1, policy=Placement.BINPACK, extender=False, mode=DieMode.ALL) as c:
        node = c.nodes["node-00"]
        for i in range(4):
            c.scheduler.schedule(c.share_pod(f"f{i}"))
        assert c.usage()["node-00"][7].shares == 4, c.picture()
        wait_for(lambda: node.ordering.equivalent >= 1, what="the full die seen and the order kept")
        assert node.ordering.republishes == 0
        assert published_shares(c, "node-00")[:2] == ["vnpu-7", "vnpu-6"]  # as published at start
        c.scheduler.schedule(c.share_pod("f4"))
        assert c.usage()["node-00"][6].shares == 1, c.picture()
        assert node.ordering.republishes == 0
        series = {
            m.name: m.samples[0].value
            for m in PlacementCollector(node.ordering, node_name="node-00", driver_name="d").collect()
        }
        assert series["flexnpu_placement_republishes"] == 0
        assert series["flexnpu_placement_orders_kept"] == node.ordering.equivalent >= 1


def test_spread_republishes_what_first_fit_would_place_otherwise(tmp_path: Path) -> None:
    with PlacementCluster(tmp_path, nodes=1, policy=Placement.SPREAD, extender=False, mode=DieMode.ALL) as c:
        node = c.nodes["node-00"]
        c.scheduler.schedule(c.share_pod("g0"))
        wait_for(
            lambda: published_shares(c, "node-00")[0] == "vnpu-6", what="die 7 listed behind the free dies"
        )
        assert node.ordering.republishes == 1 and node.ordering.equivalent == 0


def test_the_schedulers_kept_node_usage_follows_claims_that_go_and_come(tmp_path: Path) -> None:
    """The fake scheduler keeps a node's usage between pods while the node's claims are unchanged:
    a claim deleted, or allocated by another writer, is seen by the next pod."""
    with PlacementCluster(tmp_path, nodes=1, extender=False, mode=DieMode.BOTH, publishing=False) as c:
        for i in range(8):
            c.scheduler.schedule(c.whole_pod(f"w{i}"))
        with pytest.raises(Unschedulable):
            c.scheduler.schedule(c.whole_pod("w8"))
        held = {r["device"] for cl in c.scheduler.claims.items() for r in _results(cl)}
        resource = kubernetes.client.ResourceV1Api(c.server.api_client())  # type: ignore[union-attr]
        resource.delete_namespaced_resource_claim("w3-claim", NAMESPACE)
        wait_for(lambda: c.scheduler.claims.get(f"{NAMESPACE}/w3-claim") is None, what="the deletion seen")
        c.scheduler.schedule(c.pods["w8"])
        freed = {r["device"] for r in _results(c.scheduler.claims.get(f"{NAMESPACE}/w8-claim") or {})}
        assert freed and freed <= held
        # die 0 freed; a pod that cannot fit plans on the node (its usage is kept), then someone
        # else allocates a full share on die 0's share device: the next share must see it
        resource.delete_namespaced_resource_claim("w0-claim", NAMESPACE)
        wait_for(lambda: c.scheduler.claims.get(f"{NAMESPACE}/w0-claim") is None, what="the deletion seen")
        with pytest.raises(Unschedulable):
            c.scheduler.schedule(c.pod("two", {"deviceClassName": "npu.flexnpu.io", "count": 2}))
        allocate_on(c, "x-claim", "node-00", "vnpu-0", compute="100")
        wait_for(
            lambda: c.scheduler.claims.get(f"{NAMESPACE}/x-claim") is not None, what="the allocation seen"
        )
        with pytest.raises(Unschedulable):  # the other dies are held whole, die 0's compute is taken
            c.scheduler.schedule(c.share_pod("s0"))


def _results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return list(
        (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    )


def test_spread_on_one_node_takes_distinct_dies(tmp_path: Path) -> None:
    with PlacementCluster(tmp_path, nodes=1, policy=Placement.SPREAD, extender=False) as c:
        dies = []
        for i in range(4):
            c.scheduler.schedule(c.share_pod(f"s{i}"))
            first = published_shares(c, "node-00")[0]
            dies.append(first)
            # the next pod is scheduled only once the node listed another die first
            wait_for(
                lambda f=first: published_shares(c, "node-00")[0] != f, what="a republish after the share"
            )
        used = {d for d, u in c.usage()["node-00"].items() if u.used}
        assert len(used) == 4, c.picture()


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[PlacementCluster]:
    policy = getattr(request, "param", Placement.BINPACK)
    with PlacementCluster(tmp_path, nodes=3, policy=policy, extender=True) as c:
        yield c


def _client(c: PlacementCluster) -> ExtenderClient:
    assert c.extender is not None and c.extender.port
    return ExtenderClient(c.scheduler.extenders[0].spec)


def _nodes(c: PlacementCluster) -> list[dict[str, Any]]:
    return [{"metadata": {"name": n}} for n in c.node_names]


def test_prioritize_scores_the_fullest_node_for_binpack_and_the_emptiest_for_spread(
    cluster: PlacementCluster,
) -> None:
    c = cluster
    assert c.extender is not None
    recent = record_spans(c.extender.scores.tracing)
    allocate_on(c, "x-claim", "node-01", "vnpu-7")
    wait_for(lambda: c.extender is not None and c.extender.scores.fills().get("node-01", None) is not None
             and c.extender.scores.fills()["node-01"].dies_in_use == 1, what="the extender saw the allocation")  # fmt: skip
    client = _client(c)
    pod = c.share_pod("next")
    scores = client.prioritize(pod, _nodes(c))
    assert scores["node-01"] > scores["node-00"] == scores["node-02"] == 0
    spread = {**pod, "metadata": {**pod["metadata"], "annotations": {ANNOTATION: "spread"}}}
    scores = client.prioritize(spread, _nodes(c))
    assert scores["node-01"] < scores["node-00"] == scores["node-02"] == 10
    no_npu = {**pod, "spec": {"containers": [{"name": "a", "image": "x"}]}}
    assert set(client.prioritize(no_npu, _nodes(c)).values()) == {0}
    # nodeCacheCapable off: a v1 NodeList in "nodes"
    full = ExtenderClient(
        ExtenderSpec(**{**c.scheduler.extenders[0].spec.__dict__, "node_cache_capable": False})
    )
    assert full.prioritize(pod, _nodes(c))["node-01"] > 0
    assert c.extender is not None
    metrics = c.extender.scores.decisions.labels("prioritize", "spread", "scored")._value.get()
    assert metrics == 1
    spans = recent.finished()
    assert any(s.attributes and s.attributes.get("flexnpu.extender.best_node") == "node-01" for s in spans)


def test_the_extender_client_sends_a_call_in_one_tls_record(tmp_path: Path) -> None:
    """As Go's net/http (kube-scheduler's HTTPExtender), the fake's client writes the request line,
    header and JSON body at once: the server's first TLS read (one record at most) holds all of it."""
    cert, key = make_cert(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    first_read: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            with tls.wrap_socket(conn, server_side=True) as s:
                first_read.append(s.recv(65536))
                answer = b'[{"host": "node-01", "score": 7}]'
                s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        client = ExtenderClient(
            ExtenderSpec(url_prefix=f"https://127.0.0.1:{port}", node_cache_capable=True, ca_file=cert)
        )
        pod = {"metadata": {"name": "p", "namespace": NAMESPACE}, "spec": {}}
        assert client.prioritize(pod, [{"metadata": {"name": "node-01"}}]) == {"node-01": 7}
        server.join(timeout=10)
    head, _, body = first_read[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /prioritize HTTP/1.1\r\n")
    assert json.loads(body) == {"pod": pod, "nodenames": ["node-01"]}


def test_the_scores_follow_the_caches_without_a_call(cluster: PlacementCluster) -> None:
    """An allocation (and its removal) seen by the extender's claim watch recomputes that node's scores
    on the watch's thread: no prioritize call computes them, and a call answers from that table."""
    c = cluster
    assert c.extender is not None
    scores = c.extender.scores
    assert scores.scores(Placement.BINPACK).get("node-01") == 0
    allocate_on(c, "y-claim", "node-01", "vnpu-7")
    wait_for(
        lambda: scores.scores(Placement.BINPACK).get("node-01", 0) > 0, what="node-01's score from the watch"
    )
    assert scores.scores(Placement.SPREAD)["node-01"] < 10
    assert not list(scores.decisions.collect()[0].samples)  # no call so far: the watch computed them
    binpack = scores.scores(Placement.BINPACK)
    answer = _client(c).prioritize(c.share_pod("next"), _nodes(c))
    assert answer == {n: binpack[n] for n in c.node_names}
    kubernetes.client.ResourceV1Api(c.server.api_client()).delete_namespaced_resource_claim(
        "y-claim", NAMESPACE
    )
    wait_for(
        lambda: scores.scores(Placement.BINPACK)["node-01"] == 0, what="node-01 empty again from the watch"
    )
    assert scores.scores(Placement.SPREAD)["node-01"] == 10


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(b"[1,", "not JSON", id="not-json"),
        pytest.param(b'{"nodenames": ["a"]}', "field pod", id="no-pod"),
        pytest.param(b'{"pod": {}, "nodenames": [1]}', "nodenames", id="bad-names"),
        pytest.param(b'{"pod": {}}', "nodenames, nodes.items", id="no-nodes"),
    ],
)
def test_a_malformed_call_gets_400_and_the_extender_goes_on(
    cluster: PlacementCluster, body: bytes, reason: str
) -> None:
    c = cluster
    spec = c.scheduler.extenders[0].spec
    ctx = ssl.create_default_context(cafile=str(spec.ca_file))
    req = urllib.request.Request(
        spec.url_prefix + "/prioritize", data=body, headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, context=ctx, timeout=10)
    assert err.value.code == 400 and reason in err.value.read().decode()
    assert _client(c).prioritize(c.share_pod("after"), _nodes(c))  # still serving


def test_the_fake_scheduler_packs_with_the_extender(cluster: PlacementCluster) -> None:
    c = cluster
    for i in range(6):
        c.scheduler.schedule(c.share_pod(f"p{i}"))
    assert len(set(c.scheduler.bound.values())) == 1, c.picture()
    assert all(d.extender_errors == 0 for d in c.scheduler.decisions)
    assert c.scheduler.extenders[0].calls >= 5  # one per pod with more than one feasible node


def test_without_the_extender_pods_spread_by_count(tmp_path: Path) -> None:
    with PlacementCluster(tmp_path, nodes=3, policy=Placement.BINPACK, extender=False) as c:
        for i in range(6):
            c.scheduler.schedule(c.share_pod(f"p{i}"))
        assert sorted(c.scheduler.pods_on.values()) == [2, 2, 2], c.picture()


def test_a_down_extender_never_keeps_a_pod_pending(cluster: PlacementCluster) -> None:
    c = cluster
    c.stop_extender()
    bound = c.scheduler.run([(0.0, c.share_pod(f"d{i}")) for i in range(4)], deadline=60)
    assert len(bound) == 4
    assert sum(d.extender_errors for d in c.scheduler.decisions) >= 3


def test_extender_metrics_endpoint(cluster: PlacementCluster) -> None:
    c = cluster
    _client(c).prioritize(c.share_pod("m"), _nodes(c))
    spec = c.scheduler.extenders[0].spec
    ctx = ssl.create_default_context(cafile=str(spec.ca_file))
    text = urllib.request.urlopen(spec.url_prefix + "/metrics", context=ctx, timeout=10).read().decode()
    assert 'flexnpu_extender_decisions_total{outcome="scored",policy="binpack",verb="prioritize"} 1.0' in text


def test_the_node_process_reorders_its_slices_from_the_claim_watch(node_factory: Any) -> None:
    """The real node process (``flexnpu-dra plugin --placement spread``): an allocation on its first die,
    written as a scheduler writes it, moves that die's share devices to the end of the published order."""
    from tests.integration.conftest import NAMESPACE as NODE_NS
    from tests.integration.conftest import NODE

    n = node_factory("eight-910b4.yaml", FLEXNPU_DEFAULT_MODE="both", FLEXNPU_PLACEMENT="spread").start()

    def shares() -> list[str]:
        names = [d["name"] for d in n.devices()]
        return [x for x in names if x.startswith("vnpu-") and x.count("-") == 1]

    wait_for(lambda: shares()[:1] == ["vnpu-7"], what="the empty node's order")
    n.create_claim("c1", [{"name": "npu", "exactly": {"deviceClassName": "vnpu.flexnpu.io"}}])
    resource = n.resource
    body = n.api.api_client().sanitize_for_serialization(
        resource.read_namespaced_resource_claim("c1", NODE_NS)
    )
    body["status"] = {"allocation": {
        "devices": {"results": [{"request": "npu", "driver": DRIVER, "pool": NODE, "device": "vnpu-7",
                                  "shareID": str(uuid.uuid4()), "consumedCapacity": {"compute": "10", "memory": "128Mi", "shares": "1"}}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
    }}  # fmt: skip
    resource.replace_namespaced_resource_claim_status("c1", NODE_NS, body)
    wait_for(
        lambda: shares()[-1:] == ["vnpu-7"] and shares()[:1] == ["vnpu-6"], what="die 7 listed last (spread)"
    )


@pytest.mark.parametrize(
    ("args", "field"),
    [
        pytest.param(["--placement", "pack"], "placement", id="bad-policy"),
        pytest.param(["--tls-cert-file", "/nonexistent.pem"], "tls-key-file", id="cert-without-key"),
    ],
)
def test_the_extender_command_refuses_bad_flags_naming_them(args: list[str], field: str) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "kubeletplugin.cli", "extender", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and "flexnpu-dra extender:" in out.stderr and field in out.stderr


def test_the_extender_is_ready_only_once_its_watches_listed(tmp_path: Path) -> None:
    """``/readyz`` answers 503 while the API server refuses the first lists, 200 once they came in;
    ``/healthz`` (the liveness probe) answers 200 all along."""
    from controller.extender import Extender
    from controller.kube import Kube
    from dra_driver.config import ExtenderConfig
    from flexnpu_testing.fake_apiserver import FakeAPIServer
    from flexnpu_testing.placement_cluster import make_cert

    cert, key = make_cert(tmp_path)
    ctx = ssl.create_default_context(cafile=str(cert))
    with FakeAPIServer() as srv:
        kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
        srv.set_down(True)  # every list gets 503: the caches cannot sync
        settings = ExtenderConfig(
            driver_name=DRIVER, kubeconfig=str(kubeconfig), placement=Placement.BINPACK,
            host="127.0.0.1", port=0, tls_cert=cert, tls_key=key,
        )  # fmt: skip
        extender = Extender(settings, kube=Kube.from_config(str(kubeconfig)))
        stop, ready = threading.Event(), threading.Event()
        server = threading.Thread(target=extender.serve, args=(stop, ready), name="extender", daemon=True)
        server.start()
        try:
            wait_for(ready.is_set, what="the extender serving", timeout=30)
            base = f"https://127.0.0.1:{extender.port}"

            def status(path: str) -> int:
                try:
                    with urllib.request.urlopen(base + path, context=ctx, timeout=5) as r:
                        return int(r.status)
                except urllib.error.HTTPError as err:
                    return int(err.code)

            wait_for(
                lambda: any("resourceclaims" in path for _, path in srv.request_log()),
                what="the extender's first claim list refused",
                timeout=30,
            )
            assert status("/readyz") == 503 and not extender.scores.synced
            assert status("/healthz") == 200
            srv.set_down(False)
            wait_for(lambda: status("/readyz") == 200, what="/readyz after the lists", timeout=60)
            assert extender.scores.synced
        finally:
            stop.set()
            server.join(timeout=30)
    assert not server.is_alive()


def test_a_cluster_with_the_api_server_and_the_nodes_in_their_own_processes(tmp_path: Path) -> None:
    """The bench's setup: this process schedules; the fake API server and the nodes are children."""
    c = PlacementCluster(tmp_path, nodes=2, extender=False, mode=DieMode.ALL, processes=True)
    with c:
        assert c.server is None and c.nodes == {}
        for i in range(4):
            c.scheduler.schedule(c.share_pod(f"p{i}", node="node-01"))
        assert c.usage()["node-01"][7].shares == 4, c.picture()
        wait_for(
            lambda: c.node_stats()["node-01"]["equivalent"] >= 1, what="the nodes process saw die 7 full"
        )
        stats = c.node_stats()
        assert stats["node-00"] == {"republishes": 0, "equivalent": 0, "unchanged": 0}  # nothing there
        assert stats["node-01"]["republishes"] == 0
    assert c.server_proc is not None and c.server_proc.poll() is not None
    assert c.nodes_proc is not None and c.nodes_proc.poll() == 0
