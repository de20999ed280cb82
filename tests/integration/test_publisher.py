"""The slice publisher against the fake API server, through the real ``kubernetes`` client."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from controller import publisher
from controller.kube import Conflict, Kube
from controller.publisher import DroppedFieldsError, SlicePublisher
from dra_driver import slices
from dra_driver.devices import Die, DieMode, Health, Inventory
from dra_driver.errors import Unavailable
from dra_driver.testing.fake_apiserver import FakeAPIServer

DRIVER = "npu.flexnpu.io"
WRITES = {"POST", "PUT", "PATCH", "DELETE"}
DEADLINE = 20.0


def _die(phy: int, health: Health = Health.HEALTHY) -> Die:
    return Die(
        vdie_id=f"{phy:08X}-00000000-00000000-00000000-00000000",
        model="910B3",
        card_id=phy,
        chip_id=0,
        phy_id=phy,
        logic_id=phy,
        pci_bus_id=f"0000:{phy % 256:02x}:00.0",
        numa_node=0,
        memory_mib=65536,
        aicore=20,
        aicpu=7,
        health=health,
    )


def _inventory(n: int) -> Inventory:
    return Inventory(dies=tuple(_die(i) for i in range(n)), driver_version="25.5.0")


def wait_for(condition: Callable[[], Any], what: str, timeout: float = DEADLINE) -> Any:
    """Poll ``condition`` until it returns something truthy, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        pause.wait(0.05)


@dataclass
class Node:
    """One test node: the fake server, a Kube client, and a mutable inventory."""

    server: FakeAPIServer
    kube: Kube
    name: str
    uid: str
    inventory: Inventory
    use_counters: bool = True
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("test.publisher"))

    def desired(self) -> slices.DesiredPool:
        return slices.build_pool(
            self.inventory, driver_name=DRIVER, node_name=self.name, use_counters=self.use_counters
        )

    def publisher(self, **kw: Any) -> SlicePublisher:
        kw.setdefault("debounce_seconds", 0.1)
        kw.setdefault("max_backoff_seconds", 0.5)
        kw.setdefault("watch_timeout_seconds", 5)
        return SlicePublisher(
            self.kube, driver_name=DRIVER, node_name=self.name, desired=self.desired, log=self.log, **kw
        )

    def stored(self) -> list[dict[str, Any]]:
        items, _ = self.kube.list_slices(driver=DRIVER, node=self.name)
        return sorted(items, key=lambda s: s["metadata"]["name"])

    def converged(self) -> bool:
        """The server holds exactly the desired pool (what a sync would not change)."""
        return publisher.plan_sync(
            self.stored(), self.desired(), driver_name=DRIVER, node_name=self.name
        ).empty

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
    kube = Kube.from_config(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    yield Node(server=server, kube=kube, name=name, uid=created.metadata.uid, inventory=_inventory(2))
    kube.close()


@pytest.fixture
def running(node: Node) -> Iterator[Callable[..., SlicePublisher]]:
    """Start ``publisher.run`` in a thread; always stopped and joined at the end."""
    started: list[tuple[threading.Event, threading.Thread]] = []

    def start(**kw: Any) -> SlicePublisher:
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
    node.inventory = _inventory(10)  # both mode: 20 devices + 10 counter sets -> 1 + 2 slices
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
    node.inventory = Inventory(dies=(_die(0), _die(1, Health.UNHEALTHY)), driver_version="25.5.0")
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
    # 400 devices (whole + a share device per policy) in 7 slices + 13 counter slices
    node.inventory = _inventory(100)
    pub = node.publisher()
    assert pub.sync().created == 20
    node.inventory = _inventory(2)
    node.server.clear_request_log()

    result = pub.sync()

    assert result.deleted == 18
    methods = [m for m, _ in node.writes()]
    assert methods.count("DELETE") == 18
    assert "POST" not in methods
    last_delete = max(i for i, m in enumerate(methods) if m == "DELETE")
    first_put = min(i for i, m in enumerate(methods) if m == "PUT")
    assert last_delete < first_put, methods
    stored = node.stored()
    assert [s["spec"]["pool"]["resourceSliceCount"] for s in stored] == [2, 2]
    assert len({s["spec"]["pool"]["generation"] for s in stored}) == 1
    assert node.converged()


def test_kubelet_wipe_is_repaired_by_run(node: Node, running: Callable[..., SlicePublisher]) -> None:
    running()
    first = wait_for(lambda: node.converged() and node.stored(), "the first publish")
    old_names = {s["metadata"]["name"] for s in first}

    # What the kubelet does at startup: delete every slice of the node, whatever the driver.
    resource = client.ResourceV1Api(node.server.api_client())
    resource.delete_collection_resource_slice(field_selector=f"spec.nodeName={node.name}")
    assert node.stored() == []

    repaired = wait_for(lambda: node.converged() and node.stored(), "slices to be re-created")
    assert not {s["metadata"]["name"] for s in repaired} & old_names


def test_trigger_after_inventory_change_and_no_write_loop(
    node: Node, running: Callable[..., SlicePublisher]
) -> None:
    pub = running()
    wait_for(node.converged, "the first publish")
    node.inventory = _inventory(3)
    pub.trigger()
    wait_for(node.converged, "the new die to be published")

    # Once converged, further syncs (ours, or caused by our own watch events) write nothing.
    pub.trigger()
    wait_for(lambda: pub.last_result is not None and pub.last_result.writes == 0, "a no-op sync")
    node.server.clear_request_log()
    syncs = pub.syncs
    pub.trigger()
    wait_for(lambda: pub.syncs > syncs, "the triggered sync")
    assert node.writes() == []


def test_watch_gone_relists_and_repairs(node: Node, running: Callable[..., SlicePublisher]) -> None:
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    node.log = logging.getLogger(f"test.publisher.{node.name}")
    node.log.addHandler(Collect())
    node.log.setLevel(logging.INFO)
    running()
    wait_for(node.converged, "the first publish")

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

    wait_for(lambda: any("410" in r for r in records), "the watch to report 410 Gone")
    wait_for(node.converged, "the corrupted slice to be repaired")


def test_api_outage_does_not_crash_and_converges(node: Node, running: Callable[..., SlicePublisher]) -> None:
    pub = running()
    wait_for(node.converged, "the first publish")

    node.server.set_down(True)
    node.inventory = _inventory(4)
    pub.trigger()
    wait_for(lambda: isinstance(pub.last_error, Unavailable), "the sync to hit the outage")
    node.server.set_down(False)

    wait_for(node.converged, "convergence after the outage")
    wait_for(lambda: pub.last_error is None, "the error to clear")


def test_dropped_counter_fields_are_detected(server: FakeAPIServer, node: Node) -> None:
    server.drop_partitionable_fields = True
    pub = node.publisher()

    with pytest.raises(DroppedFieldsError) as info:
        pub.sync()
    assert {"sharedCounters", "consumesCounters"} & set(info.value.fields)
    assert info.value.result.created == 1  # the sync stopped at the first slice that lost fields

    node.use_counters = False  # the fallback: one mode per die, no counters
    result = pub.sync()
    assert result.writes > 0
    assert pub.sync().writes == 0
    stored = node.stored()
    names = [d["name"] for s in stored for d in s["spec"].get("devices", [])]
    assert names == ["npu-0", "npu-1"]
    assert node.converged()


def test_dropped_fields_fallback_in_run(
    server: FakeAPIServer, node: Node, running: Callable[..., SlicePublisher]
) -> None:
    server.drop_partitionable_fields = True
    seen: list[DroppedFieldsError] = []

    def fall_back(err: DroppedFieldsError) -> None:
        seen.append(err)
        node.use_counters = False

    running(on_dropped_fields=fall_back)
    wait_for(lambda: seen and node.converged(), "the fallback pool")
    assert len(seen) == 1
    assert all("sharedCounters" not in s["spec"] for s in node.stored())


def test_node_modes_from_inventory(node: Node) -> None:
    node.inventory = replace(_inventory(2), die_modes={0: DieMode.WHOLE, 1: DieMode.SOFT})
    node.publisher().sync()
    names = [d["name"] for s in node.stored() for d in s["spec"].get("devices", [])]
    assert names == ["npu-0", "vnpu-1", "vnpu-1-fixed", "vnpu-1-best-effort"]


def test_slice_deleted_during_sync_is_retried(node: Node, running: Callable[..., SlicePublisher]) -> None:
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
    node.inventory = _inventory(3)
    with pytest.raises(Conflict):
        node.publisher().sync()
    running()
    wait_for(node.converged, "convergence after the wipe")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param("npu.flexnpu.io", "vnpu.flexnpu.io", id="whole-blocks-share"),
        pytest.param("vnpu.flexnpu.io", "npu.flexnpu.io", id="share-blocks-whole"),
    ],
)
def test_published_both_mode_keeps_whole_and_shares_apart(node: Node, first: str, second: str) -> None:
    """The published counters make a (simulated) first-fit allocator exclude whole vs. shares."""
    from dra_driver.testing.scheduler import SchedulerSim, Unschedulable

    node.inventory = _inventory(1)  # one die, published as npu-0 + vnpu-0 sharing die-0
    node.publisher().sync()
    api_client = node.server.api_client()
    client.CoreV1Api(api_client).create_namespace(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "t"}}
    )
    api = client.ResourceV1Api(api_client)
    for cls, mode in (("npu.flexnpu.io", "whole"), ("vnpu.flexnpu.io", "soft")):
        expression = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].mode == "{mode}"'
        api.create_device_class(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": cls},
                "spec": {"selectors": [{"cel": {"expression": expression}}]},
            }
        )
    for name, cls in (("first", first), ("second", second), ("third", "vnpu.flexnpu.io")):
        request: dict[str, Any] = {"deviceClassName": cls}
        if cls == "vnpu.flexnpu.io":
            request["capacity"] = {"requests": {"memory": "1Gi"}}
        api.create_namespaced_resource_claim(
            "t",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": {"devices": {"requests": [{"name": "npu", "exactly": request}]}},
            },
        )
    sim = SchedulerSim(api_client, DRIVER)
    sim.allocate("t", "first", node.name)
    with pytest.raises(Unschedulable):
        sim.allocate("t", "second", node.name)
    if first == "vnpu.flexnpu.io":  # shares still fit next to shares
        sim.allocate("t", "third", node.name)
        sim.deallocate("t", "third")
    sim.deallocate("t", "first")
    sim.allocate("t", "second", node.name)
    api_client.close()
