"""The ResourceSlice controller against the fake API server, through the real ``kubernetes`` client.

The pools are generic: per "die" ``i`` a whole device ``npu-<i>`` that consumes all of counter set
``die-<i>`` and a shared device ``vnpu-<i>`` that consumes a token of it (the shape a driver uses to
keep whole and shared use of one device apart in the scheduler); without counters only the whole
devices. No NPU code is involved.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dra_kubeletplugin import errors
from dra_kubeletplugin.errors import DroppedFieldsError
from dra_kubeletplugin.kubeapi import KubeClient
from dra_kubeletplugin.resourceslice import pools, sync
from dra_kubeletplugin.resourceslice.controller import SliceController
from dra_kubeletplugin.resourceslice.pools import DriverResources, Pool
from flexnpu_testing.fake_apiserver import FakeAPIServer
from flexnpu_testing.waiting import wait_for

DRIVER = "gpu.example.com"
WRITES = {"POST", "PUT", "PATCH", "DELETE"}


def build_pool(
    name: str, dies: int, *, counters: bool = True, unhealthy: frozenset[int] = frozenset()
) -> Pool:
    """``dies`` whole devices (and, with counters, as many shared devices and counter sets)."""

    def uses(i: int, amount: str) -> dict[str, Any]:
        return {"consumesCounters": [{"counterSet": f"die-{i}", "counters": {"memory": {"value": amount}}}]}

    whole = [
        {
            "name": f"npu-{i}",
            "attributes": {"healthy": {"bool": i not in unhealthy}},
            **(uses(i, "64Gi") if counters else {}),
        }
        for i in range(dies)
    ]
    shared = (
        [
            {
                "name": f"vnpu-{i}",
                "allowMultipleAllocations": True,
                "attributes": {"healthy": {"bool": i not in unhealthy}},
                **uses(i, "1"),
            }
            for i in reversed(range(dies))
        ]
        if counters
        else []
    )
    sets = (
        [{"name": f"die-{i}", "counters": {"memory": {"value": "64Gi"}}} for i in range(dies)]
        if counters
        else []
    )
    return Pool(name=name, slices=pools.split(whole + shared, sets))


@dataclass
class Node:
    """One test node: the fake server, a client, and what the driver wants published."""

    server: FakeAPIServer
    kube: KubeClient
    name: str
    uid: str
    dies: int = 2
    use_counters: bool = True
    unhealthy: frozenset[int] = frozenset()
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("test.publisher"))

    def desired(self) -> Pool:
        return build_pool(self.name, self.dies, counters=self.use_counters, unhealthy=self.unhealthy)

    def resources(self) -> DriverResources:
        return DriverResources.single(self.desired())

    def publisher(self, **kw: Any) -> SliceController:
        kw.setdefault("debounce_seconds", 0.1)
        kw.setdefault("max_backoff_seconds", 0.5)
        kw.setdefault("watch_timeout_seconds", 5)
        return SliceController(
            self.kube, driver_name=DRIVER, node_name=self.name, resources=self.resources(), log=self.log, **kw
        )

    def stored(self) -> list[dict[str, Any]]:
        items, _ = self.kube.list_slices(driver=DRIVER, node=self.name)
        return sorted(items, key=lambda s: s["metadata"]["name"])

    def converged(self) -> bool:
        """The server holds exactly the desired pool (what a sync would not change)."""
        return sync.plan_sync(self.stored(), self.desired(), driver_name=DRIVER, node_name=self.name).empty

    def writes(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p in self.server.request_log() if m in WRITES]


@pytest.fixture
def server() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as srv:
        yield srv


@pytest.fixture
def node(server: FakeAPIServer, tmp_path: Path) -> Iterator[Node]:
    name = f"node-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(server.api_client())
    created = core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    kube = KubeClient.from_config(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    yield Node(server=server, kube=kube, name=name, uid=created.metadata.uid)
    kube.close()


@pytest.fixture
def running(node: Node) -> Iterator[Callable[..., SliceController]]:
    """Start ``publisher.run`` in a thread; always stopped and joined at the end."""
    started: list[tuple[threading.Event, threading.Thread]] = []

    def start(**kw: Any) -> SliceController:
        pub = node.publisher(**kw)
        stop = threading.Event()
        thread = threading.Thread(target=pub.run, args=(stop,), name="publisher-under-test")
        thread.start()
        started.append((stop, thread))
        return pub

    yield start
    for stop, thread in started:
        stop.set()
        thread.join(timeout=10)
        assert not thread.is_alive(), "publisher.run did not stop"


def test_first_publish_creates_with_generate_name_and_owner(node: Node) -> None:
    node.dies = 10  # 20 devices + 10 counter sets -> 1 + 2 slices
    node.server.clear_request_log()
    result = node.publisher().sync()

    assert (result.created, result.updated, result.deleted, result.generation) == (3, 0, 0, 1)
    stored = node.stored()
    assert len(stored) == 3
    for index, item in enumerate(stored):
        meta, spec = item["metadata"], item["spec"]
        assert meta["name"].startswith(f"{index:05x}-{DRIVER}-{node.name}-")
        assert meta["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid, "controller": True}
        ]
        assert spec["driver"] == DRIVER
        assert spec["nodeName"] == node.name
        assert spec["pool"] == {"name": node.name, "generation": 1, "resourceSliceCount": 3}
    assert [d["name"] for d in stored[0]["spec"]["devices"]][:2] == ["npu-0", "npu-1"]
    assert [len(s["spec"].get("sharedCounters", [])) for s in stored] == [0, 8, 2]
    assert sum(1 for m, _ in node.writes() if m == "POST") == 3
    assert node.converged()


def test_second_sync_makes_no_writes(node: Node) -> None:
    pub = node.publisher()
    pub.sync()
    node.server.clear_request_log()

    result = pub.sync()

    assert result.writes == 0
    assert node.writes() == []
    assert node.server.request_log(), "the sync must at least list"


def test_inventory_change_updates_in_place(node: Node) -> None:
    pub = node.publisher()
    pub.sync()
    before = {s["metadata"]["name"]: s["metadata"]["uid"] for s in node.stored()}
    node.unhealthy = frozenset({1})
    pub.update(node.resources())
    node.server.clear_request_log()

    result = pub.sync()

    assert (result.updated, result.created, result.deleted, result.generation) == (1, 0, 0, 1)
    assert [m for m, _ in node.writes()] == ["PUT"]
    after = node.stored()
    assert {s["metadata"]["name"]: s["metadata"]["uid"] for s in after} == before
    devices = {d["name"]: d for s in after for d in s["spec"].get("devices", [])}
    assert devices["npu-1"]["attributes"]["healthy"] == {"bool": False}
    assert node.converged()


def test_removing_dies_shrinks_slices_deleting_first(node: Node) -> None:
    node.dies = 100  # 200 devices in 4 slices + 13 counter slices
    pub = node.publisher()
    assert pub.sync().created == 17
    node.dies = 2
    pub.update(node.resources())
    node.server.clear_request_log()

    result = pub.sync()

    assert result.deleted == 15
    methods = [m for m, _ in node.writes()]
    assert methods.count("DELETE") == 15
    assert "POST" not in methods
    last_delete = max(i for i, m in enumerate(methods) if m == "DELETE")
    first_put = min(i for i, m in enumerate(methods) if m == "PUT")
    assert last_delete < first_put, methods
    stored = node.stored()
    assert [s["spec"]["pool"]["resourceSliceCount"] for s in stored] == [2, 2]
    assert len({s["spec"]["pool"]["generation"] for s in stored}) == 1
    assert node.converged()


def test_kubelet_wipe_is_repaired_by_run(node: Node, running: Callable[..., SliceController]) -> None:
    running()
    first = wait_for(lambda: node.converged() and node.stored(), what="the first publish")
    old_names = {s["metadata"]["name"] for s in first}

    # What the kubelet does at startup: delete every slice of the node, whatever the driver.
    resource = client.ResourceV1Api(node.server.api_client())
    resource.delete_collection_resource_slice(field_selector=f"spec.nodeName={node.name}")
    assert node.stored() == []

    repaired = wait_for(lambda: node.converged() and node.stored(), what="slices to be re-created")
    assert not {s["metadata"]["name"] for s in repaired} & old_names


def test_update_then_no_write_loop(node: Node, running: Callable[..., SliceController]) -> None:
    pub = running()
    wait_for(node.converged, what="the first publish")
    node.dies = 3
    pub.update(node.resources())
    wait_for(node.converged, what="the new die to be published")

    # Once converged, further syncs (ours, or caused by our own watch events) write nothing.
    pub.trigger()
    wait_for(lambda: pub.last_result is not None and pub.last_result.writes == 0, what="a no-op sync")
    node.server.clear_request_log()
    syncs = pub.syncs
    pub.trigger()
    wait_for(lambda: pub.syncs > syncs, what="the triggered sync")
    assert node.writes() == []


def test_watch_gone_relists_and_repairs(node: Node, running: Callable[..., SliceController]) -> None:
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    node.log = logging.getLogger(f"test.publisher.{node.name}")
    node.log.addHandler(Collect())
    node.log.setLevel(logging.INFO)
    running()
    wait_for(node.converged, what="the first publish")

    # While the API is down the watch cannot resume; meanwhile a slice is corrupted and the
    # history compacted, so the resumed watch gets 410 Gone and must relist to see it.
    name = node.stored()[0]["metadata"]["name"]
    node.server.set_down(True)
    victim = node.server.get_object("resourceslices", name)
    assert victim is not None
    victim["spec"]["devices"] = victim["spec"]["devices"][:1]
    node.server.put_object("resourceslices", victim)
    node.server.compact()
    node.server.set_down(False)

    wait_for(lambda: any("410" in r for r in records), what="the watch to report 410 Gone")
    wait_for(node.converged, what="the corrupted slice to be repaired")


def test_api_outage_does_not_crash_and_converges(node: Node, running: Callable[..., SliceController]) -> None:
    pub = running()
    wait_for(node.converged, what="the first publish")

    node.server.set_down(True)
    node.dies = 4
    pub.update(node.resources())
    wait_for(lambda: isinstance(pub.last_error, errors.ApiUnavailable), what="the sync to hit the outage")
    node.server.set_down(False)

    wait_for(node.converged, what="convergence after the outage")
    wait_for(lambda: pub.last_error is None, what="the error to clear")


def test_dropped_counter_fields_are_detected(server: FakeAPIServer, node: Node) -> None:
    server.drop_partitionable_fields = True
    pub = node.publisher()

    with pytest.raises(DroppedFieldsError) as info:
        pub.sync()
    assert {"sharedCounters", "consumesCounters"} & set(info.value.fields)
    assert info.value.result.created == 1  # the sync stopped at the first slice that lost fields

    node.use_counters = False  # the fallback: no counters
    pub.update(node.resources())
    result = pub.sync()
    assert result.writes > 0
    assert pub.sync().writes == 0
    stored = node.stored()
    names = [d["name"] for s in stored for d in s["spec"].get("devices", [])]
    assert names == ["npu-0", "npu-1"]
    assert node.converged()


def test_dropped_fields_fallback_in_run(
    server: FakeAPIServer, node: Node, running: Callable[..., SliceController]
) -> None:
    server.drop_partitionable_fields = True
    seen: list[DroppedFieldsError] = []
    started: list[SliceController] = []

    def fall_back(err: DroppedFieldsError) -> None:
        seen.append(err)
        node.use_counters = False
        started[0].update(node.resources())

    started.append(running(on_dropped_fields=fall_back))
    wait_for(lambda: seen and node.converged(), what="the fallback pool")
    assert len(seen) == 1
    assert all("sharedCounters" not in s["spec"] for s in node.stored())


def test_slice_deleted_during_sync_is_retried(node: Node, running: Callable[..., SliceController]) -> None:
    """A PUT to a slice the kubelet just deleted (404) is a conflict: relist and converge."""
    node.publisher().sync()
    real_update = node.kube.update_slice
    wiped = threading.Event()

    def update_after_wipe(body: dict[str, Any]) -> dict[str, Any]:
        if not wiped.is_set():
            wiped.set()
            resource = client.ResourceV1Api(node.server.api_client())
            resource.delete_collection_resource_slice(field_selector=f"spec.nodeName={node.name}")
        return real_update(body)

    node.kube.update_slice = update_after_wipe  # type: ignore[method-assign]
    node.dies = 3
    with pytest.raises(errors.Conflict):
        node.publisher().sync()
    running()
    wait_for(node.converged, what="convergence after the wipe")
