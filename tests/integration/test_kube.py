"""controller.kube against the fake API server: dicts in and out, errors translated."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from controller import kube
from controller.kube import Kube
from dra_driver.errors import ErrorCode, Unavailable
from flexnpu_testing.fake_apiserver import FakeAPIServer

DRIVER = "npu.flexnpu.io"
NODE = "node-k"


@pytest.fixture
def server() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as srv:
        client.CoreV1Api(srv.api_client()).create_node(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
        )
        yield srv


@pytest.fixture
def k(server: FakeAPIServer, tmp_path: Path) -> Iterator[Kube]:
    api = Kube.from_config(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    yield api
    api.close()


def _slice(devices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"00000-{DRIVER}-{NODE}-"},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "nodeName": NODE,
            "devices": devices or [{"name": "npu-0", "capacity": {"memory": {"value": "68719476736"}}}],
        },
    }


def test_slice_round_trip_as_plain_dicts(k: Kube) -> None:
    created = k.create_slice(_slice())
    assert isinstance(created, dict)
    assert created["metadata"]["name"].startswith(f"00000-{DRIVER}-{NODE}-")
    assert created["spec"]["devices"][0]["capacity"]["memory"]["value"] == "68719476736"

    items, rv = k.list_slices(driver=DRIVER, node=NODE)
    assert [i["metadata"]["name"] for i in items] == [created["metadata"]["name"]]
    assert int(rv) >= int(created["metadata"]["resourceVersion"])

    created["spec"]["devices"].append({"name": "npu-1"})
    updated = k.update_slice(created)
    assert [d["name"] for d in updated["spec"]["devices"]] == ["npu-0", "npu-1"]


def test_unknown_fields_pass_through(server: FakeAPIServer, k: Kube) -> None:
    """Fields this client's models lack must not be rejected client-side (no pydantic validation)."""
    body = _slice([{"name": "npu-0", "futureField": {"x": 1}}])
    created = k.create_slice(body)
    assert created["spec"]["devices"][0]["futureField"] == {"x": 1}
    k.update_slice(created)


def test_stale_update_is_conflict(k: Kube) -> None:
    created = k.create_slice(_slice())
    k.update_slice({**created, "spec": {**created["spec"], "devices": []}})
    with pytest.raises(kube.Conflict) as info:
        k.update_slice(created)  # the old resourceVersion
    assert isinstance(info.value, Unavailable)
    assert info.value.code == ErrorCode.API_CONFLICT


def test_delete_preconditions_and_not_found(k: Kube) -> None:
    created = k.create_slice(_slice())
    meta = created["metadata"]
    with pytest.raises(kube.Conflict):
        k.delete_slice(meta["name"], uid="wrong-uid", resource_version=meta["resourceVersion"])
    k.delete_slice(meta["name"], uid=meta["uid"], resource_version=meta["resourceVersion"])
    assert k.list_slices(driver=DRIVER, node=NODE)[0] == []
    k.delete_slice(meta["name"], uid=meta["uid"], resource_version=meta["resourceVersion"])  # gone: fine


def test_invalid_slice_is_invalid_input(k: Kube) -> None:
    body = _slice([{"name": "NOT_A_LABEL"}])
    with pytest.raises(kube.InvalidInput) as info:
        k.create_slice(body)
    assert "HTTP 422" in str(info.value)


def test_outage_is_unavailable(server: FakeAPIServer, k: Kube) -> None:
    server.set_down(True)
    with pytest.raises(Unavailable, match="HTTP 503"):
        k.get_node(NODE)


def test_watch_events_and_stop(k: Kube) -> None:
    _, rv = k.list_slices(driver=DRIVER, node=NODE)
    stop = threading.Event()
    events: list[tuple[str, str]] = []
    got_two = threading.Event()

    def watch() -> None:
        for kind, obj in k.watch_slices(
            driver=DRIVER, node=NODE, resource_version=rv, timeout_seconds=30, stop=stop
        ):
            if kind != "BOOKMARK":
                events.append((kind, obj["metadata"]["name"]))
            if len(events) == 2:
                got_two.set()

    thread = threading.Thread(target=watch)
    thread.start()
    created = k.create_slice(_slice())
    meta = created["metadata"]
    k.delete_slice(meta["name"], uid=meta["uid"], resource_version=meta["resourceVersion"])
    assert got_two.wait(10)
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive(), "stop must end a blocked watch"
    assert events == [("ADDED", meta["name"]), ("DELETED", meta["name"])]


def test_watch_from_compacted_version_is_gone(server: FakeAPIServer, k: Kube) -> None:
    _, rv = k.list_slices(driver=DRIVER, node=NODE)
    k.create_slice(_slice())
    server.compact()
    with pytest.raises(kube.Gone):
        for _ in k.watch_slices(
            driver=DRIVER, node=NODE, resource_version=rv, timeout_seconds=5, stop=threading.Event()
        ):
            pass


def test_a_claim_watch_drops_skipped_lines_undecoded_and_resumes_after_them(
    server: FakeAPIServer, k: Kube
) -> None:
    """``skip`` drops lines undecoded; the stream's end still brings the newest version (a
    BOOKMARK of the last line skipped, or the server's own), so a watch resumed from it gets
    nothing again."""
    client.CoreV1Api(server.api_client()).create_namespace(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}
    )
    resource = client.ResourceV1Api(server.api_client())
    _, rv = k.list_claims()
    stored = []
    for name in ("keep-1", "drop-1", "keep-2", "drop-2", "drop-3"):
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "c"}}]}},
        }
        stored.append(resource.create_namespaced_resource_claim("ns", body).metadata.resource_version)
    asked: list[bytes] = []

    def skip(line: bytes) -> bool:
        asked.append(line)
        return b'"drop-' in line

    events = list(k.watch_claims(resource_version=rv, timeout_seconds=1, stop=threading.Event(), skip=skip))
    kept = [(kind, obj["metadata"]["name"]) for kind, obj in events if kind != "BOOKMARK"]
    assert kept == [("ADDED", "keep-1"), ("ADDED", "keep-2")]
    assert sum(b'"drop-' in line for line in asked) == 3  # each asked about once, undecoded
    newest = events[-1][1]["metadata"]["resourceVersion"]
    assert events[-1][0] == "BOOKMARK" and int(newest) >= int(stored[-1])
    again = k.watch_claims(resource_version=newest, timeout_seconds=1, stop=threading.Event(), skip=skip)
    assert [kind for kind, _ in again if kind != "BOOKMARK"] == []


def test_claims_and_events(server: FakeAPIServer, k: Kube) -> None:
    core = client.CoreV1Api(server.api_client())
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}})
    resource = client.ResourceV1Api(server.api_client())
    resource.create_namespaced_resource_claim(
        "ns",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c1"},
            "spec": {
                "devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "vnpu.flexnpu.io"}}]}
            },
        },
    )
    claim = k.get_claim("ns", "c1")
    assert claim["metadata"]["name"] == "c1"

    result = {"request": "r", "driver": DRIVER, "pool": NODE, "device": "vnpu-0"}
    status = {
        "allocation": {"devices": {"results": [result]}},
        "devices": [{"driver": DRIVER, "pool": NODE, "device": "vnpu-0"}],
    }
    patched = k.patch_claim_status("ns", "c1", {"status": status}, field_manager=DRIVER)
    assert patched["status"]["devices"][0]["device"] == "vnpu-0"

    with pytest.raises(kube.NotFound) as info:
        k.get_claim("ns", "missing")
    assert info.value.code == ErrorCode.CLAIM_NOT_FOUND

    event = k.create_event(
        involved={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "name": "c1",
            "namespace": "ns",
        },
        reason="Prepared",
        message="claim prepared",
    )
    assert event["reason"] == "Prepared"
    assert event["metadata"]["namespace"] == "ns"


def test_deferred_client_connects_on_first_use(server: FakeAPIServer, tmp_path: Path) -> None:
    lazy = Kube.deferred(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    try:
        assert lazy._api_client is None  # nothing loaded until a request or connect()
        assert lazy.get_node(NODE)["metadata"]["name"] == NODE
    finally:
        lazy.close()
    bad = Kube.deferred(str(tmp_path / "missing-kubeconfig"))
    with pytest.raises(kube.InvalidInput) as info:
        bad.connect()
    assert info.value.field == "kubeconfig"
