"""The fake apiserver, driven only through the official ``kubernetes`` client (REST and watch)."""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from flexnpu_testing import pythonpath_env
from flexnpu_testing.fake_apiserver import FakeAPIServer

DRIVER = "npu.flexnpu.io"
NS = "team-a"
ALNUM = "bcdfghjklmnpqrstvwxz2456789"


@pytest.fixture
def srv() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(watch_history=100) as server:
        yield server


@pytest.fixture
def api(srv: FakeAPIServer) -> Iterator[client.ResourceV1Api]:
    api_client = srv.api_client()
    yield client.ResourceV1Api(api_client)
    api_client.close()


@pytest.fixture
def core(srv: FakeAPIServer) -> Iterator[client.CoreV1Api]:
    api_client = srv.api_client()
    core = client.CoreV1Api(api_client)
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    yield core
    api_client.close()


def device(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, **extra}


def slice_body(
    name: str | None = None,
    *,
    node: str = "node-a",
    driver: str = DRIVER,
    pool: str | None = None,
    devices: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name} if name else {"generateName": f"{node}-{driver}-"}
    if labels:
        meta["labels"] = labels
    body_spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": pool or node, "generation": 1, "resourceSliceCount": 1},
        "devices": devices if devices is not None else [device("die-0")],
    }
    if node:
        body_spec["nodeName"] = node
    body_spec.update(spec)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": meta, "spec": body_spec}


def claim_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "devices": {"requests": [{"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}]}
        },
    }


def allocated_status(*devices: str, share: dict[str, str] | None = None) -> dict[str, Any]:
    results = [{"request": "npu", "driver": DRIVER, "pool": "node-a", "device": d} for d in devices]
    return {
        "allocation": {
            "devices": {"results": results},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
                ]
            },
        }
    }


def raw(resp: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(resp.data)
    return out


def status_of(exc: ApiException) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(exc.body)
    return out


def make_allocated_claim(api: client.ResourceV1Api, name: str, *devices: str) -> dict[str, Any]:
    api.create_namespaced_resource_claim(NS, claim_body(name))
    body = {**claim_body(name), "status": allocated_status(*devices)}
    return raw(api.replace_namespaced_resource_claim_status(name, NS, body, _preload_content=False))


# --------------------------------------------------------------------------- object metadata


@pytest.mark.parametrize(
    ("base", "expected_prefix"),
    [
        pytest.param("node-a-npu.flexnpu.io-", "node-a-npu.flexnpu.io-", id="short-base-kept"),
        pytest.param("x" * 70 + "-", "x" * 58, id="long-base-truncated-to-58"),
    ],
)
def test_generate_name_appends_five_random_chars(
    api: client.ResourceV1Api, base: str, expected_prefix: str
) -> None:
    body = slice_body()
    body["metadata"] = {"generateName": base}
    names = {api.create_resource_slice(body).metadata.name for _ in range(3)}
    assert len(names) == 3
    for name in names:
        assert name.startswith(expected_prefix)
        assert len(name) == len(expected_prefix) + 5
        assert all(c in ALNUM for c in name[-5:])


def test_create_fills_uid_timestamp_generation_and_name_or_generate_name_is_required(
    api: client.ResourceV1Api,
) -> None:
    created = raw(api.create_resource_slice(slice_body("s1"), _preload_content=False))
    meta = created["metadata"]
    assert re.fullmatch(r"[0-9a-f-]{36}", meta["uid"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["creationTimestamp"])
    assert meta["generation"] == 1
    body = slice_body()
    body["metadata"] = {}
    with pytest.raises(ApiException) as err:
        api.create_resource_slice(body)
    assert err.value.status == 422
    assert status_of(err.value)["details"]["causes"][0]["field"] == "metadata.name"


def test_resource_version_is_global_and_monotonic(
    srv: FakeAPIServer, api: client.ResourceV1Api, core: client.CoreV1Api
) -> None:
    seen = [int(core.read_namespace(NS).metadata.resource_version)]
    seen.append(int(api.create_resource_slice(slice_body("s1")).metadata.resource_version))
    seen.append(
        int(
            core.create_node(
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}
            ).metadata.resource_version
        )
    )
    seen.append(
        int(api.patch_resource_slice("s1", {"metadata": {"labels": {"a": "b"}}}).metadata.resource_version)
    )
    seen.append(int(api.delete_resource_slice("s1").metadata.resource_version))
    listed = int(api.list_resource_slice().metadata.resource_version)
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert listed == seen[-1] == srv.resource_version()


def test_noop_update_keeps_resource_version(api: client.ResourceV1Api) -> None:
    created = api.create_resource_slice(slice_body("s1"))
    again = api.replace_resource_slice("s1", created)
    assert again.metadata.resource_version == created.metadata.resource_version


def test_generation_bumps_only_on_spec_change(api: client.ResourceV1Api) -> None:
    api.create_resource_slice(slice_body("s1"))
    labelled = api.patch_resource_slice("s1", {"metadata": {"labels": {"x": "y"}}})
    assert labelled.metadata.generation == 1
    changed = api.patch_resource_slice("s1", {"spec": {"devices": [device("die-0"), device("die-1")]}})
    assert changed.metadata.generation == 2


# --------------------------------------------------------------------------- errors


def test_stale_put_conflicts_and_put_without_resource_version_is_unconditional(
    api: client.ResourceV1Api,
) -> None:
    first = raw(api.create_resource_slice(slice_body("s1"), _preload_content=False))
    api.patch_resource_slice("s1", {"metadata": {"labels": {"bump": "1"}}})
    stale = {**first, "spec": {**first["spec"], "devices": [device("die-9")]}}
    with pytest.raises(ApiException) as err:
        api.replace_resource_slice("s1", stale)
    body = status_of(err.value)
    assert (err.value.status, body["reason"], body["kind"]) == (409, "Conflict", "Status")
    assert "the object has been modified" in body["message"]
    stale["metadata"].pop("resourceVersion")
    assert api.replace_resource_slice("s1", stale).spec.devices[0].name == "die-9"


def test_create_existing_name_is_already_exists(api: client.ResourceV1Api) -> None:
    api.create_resource_slice(slice_body("s1"))
    with pytest.raises(ApiException) as err:
        api.create_resource_slice(slice_body("s1"))
    assert err.value.status == 409
    assert status_of(err.value)["reason"] == "AlreadyExists"


def test_not_found_is_a_status_object(api: client.ResourceV1Api) -> None:
    with pytest.raises(ApiException) as err:
        api.read_resource_slice("missing")
    assert err.value.status == 404
    assert status_of(err.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'resourceslices.resource.k8s.io "missing" not found',
        "reason": "NotFound",
        "code": 404,
        "details": {"name": "missing", "group": "resource.k8s.io", "kind": "resourceslices"},
    }


def test_create_in_missing_namespace_is_not_found(api: client.ResourceV1Api) -> None:
    with pytest.raises(ApiException) as err:
        api.create_namespaced_resource_claim("nowhere", {**claim_body("c"), "metadata": {"name": "c"}})
    assert err.value.status == 404
    assert 'namespaces "nowhere" not found' in status_of(err.value)["message"]


def test_create_with_resource_version_is_rejected(api: client.ResourceV1Api) -> None:
    body = slice_body("s1")
    body["metadata"]["resourceVersion"] = "7"
    with pytest.raises(ApiException) as err:
        api.create_resource_slice(body)
    assert err.value.status == 500
    assert "resourceVersion should not be set" in status_of(err.value)["message"]


# --------------------------------------------------------------------------- delete


@pytest.mark.parametrize(
    ("field", "message"),
    [
        pytest.param("uid", "UID in precondition", id="uid-mismatch"),
        pytest.param("resource_version", "ResourceVersion in precondition", id="resource-version-mismatch"),
    ],
)
def test_delete_precondition_mismatch_conflicts(api: client.ResourceV1Api, field: str, message: str) -> None:
    api.create_resource_slice(slice_body("s1"))
    pre = client.V1Preconditions(**{field: "0"})
    with pytest.raises(ApiException) as err:
        api.delete_resource_slice("s1", body=client.V1DeleteOptions(preconditions=pre))
    assert err.value.status == 409
    assert message in status_of(err.value)["message"]
    assert api.read_resource_slice("s1").metadata.name == "s1"


def test_delete_returns_the_object_and_missing_is_not_found(api: client.ResourceV1Api) -> None:
    created = api.create_resource_slice(slice_body("s1"))
    pre = client.V1Preconditions(uid=created.metadata.uid, resource_version=created.metadata.resource_version)
    deleted = api.delete_resource_slice("s1", body=client.V1DeleteOptions(preconditions=pre))
    assert isinstance(deleted, client.V1ResourceSlice)
    assert (deleted.metadata.name, deleted.metadata.uid) == ("s1", created.metadata.uid)
    with pytest.raises(ApiException) as err:
        api.delete_resource_slice("s1")
    assert err.value.status == 404


def test_delete_with_finalizer_sets_deletion_timestamp_until_finalizer_removed(
    api: client.ResourceV1Api, core: client.CoreV1Api
) -> None:
    body = claim_body("c1")
    body["metadata"]["finalizers"] = ["example.com/keep"]
    api.create_namespaced_resource_claim(NS, body)
    api.delete_namespaced_resource_claim("c1", NS)
    pending = api.read_namespaced_resource_claim("c1", NS)
    assert pending.metadata.deletion_timestamp is not None
    api.patch_namespaced_resource_claim("c1", NS, [{"op": "remove", "path": "/metadata/finalizers"}])
    with pytest.raises(ApiException) as err:
        api.read_namespaced_resource_claim("c1", NS)
    assert err.value.status == 404


def test_deletecollection_by_field_selector_removes_one_nodes_slices(
    srv: FakeAPIServer, api: client.ResourceV1Api
) -> None:
    for node in ("node-a", "node-a", "node-b"):
        api.create_resource_slice(slice_body(node=node))
    out = api.delete_collection_resource_slice(field_selector="spec.nodeName=node-a")
    assert out is not None
    left = api.list_resource_slice().items
    assert [s.spec.node_name for s in left] == ["node-b"]


# --------------------------------------------------------------------------- selectors


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        pytest.param("spec.nodeName=node-a", {"a1", "a2"}, id="node-name"),
        pytest.param("spec.nodeName==node-b", {"b1"}, id="node-name-double-equals"),
        pytest.param("spec.nodeName!=node-a", {"b1", "other-driver"}, id="node-name-not"),
        pytest.param(f"spec.driver={DRIVER}", {"a1", "a2", "b1"}, id="driver"),
        pytest.param(f"spec.nodeName=node-a,spec.driver={DRIVER}", {"a1", "a2"}, id="node-and-driver"),
        pytest.param("spec.pool.name=pool-2", {"a2"}, id="pool-name"),
        pytest.param("metadata.name=b1", {"b1"}, id="metadata-name"),
    ],
)
def test_field_selectors_on_list(api: client.ResourceV1Api, selector: str, expected: set[str]) -> None:
    api.create_resource_slice(slice_body("a1", node="node-a"))
    api.create_resource_slice(slice_body("a2", node="node-a", pool="pool-2"))
    api.create_resource_slice(slice_body("b1", node="node-b"))
    api.create_resource_slice(slice_body("other-driver", node="node-c", driver="gpu.example.com"))
    assert {s.metadata.name for s in api.list_resource_slice(field_selector=selector).items} == expected


def test_unsupported_field_selector_is_bad_request(api: client.ResourceV1Api) -> None:
    with pytest.raises(ApiException) as err:
        api.list_resource_slice(field_selector="spec.devices=x")
    assert err.value.status == 400
    assert status_of(err.value)["message"] == "field label not supported: spec.devices"


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        pytest.param("tier=gold", {"gold"}, id="equals"),
        pytest.param("tier==gold", {"gold"}, id="double-equals"),
        pytest.param("tier!=gold", {"silver", "plain"}, id="not-equals-includes-missing"),
        pytest.param("tier in (gold,silver)", {"gold", "silver"}, id="in"),
        pytest.param("tier notin (gold)", {"silver", "plain"}, id="notin"),
        pytest.param("tier", {"gold", "silver"}, id="exists"),
        pytest.param("!tier", {"plain"}, id="not-exists"),
        pytest.param("tier,zone=z1", {"gold"}, id="and"),
    ],
)
def test_label_selectors_on_list(api: client.ResourceV1Api, selector: str, expected: set[str]) -> None:
    api.create_resource_slice(slice_body("gold", labels={"tier": "gold", "zone": "z1"}))
    api.create_resource_slice(slice_body("silver", labels={"tier": "silver"}))
    api.create_resource_slice(slice_body("plain"))
    assert {s.metadata.name for s in api.list_resource_slice(label_selector=selector).items} == expected


def test_list_items_omit_kind_and_carry_list_resource_version(api: client.ResourceV1Api) -> None:
    api.create_resource_slice(slice_body("s1"))
    listed = raw(api.list_resource_slice(_preload_content=False))
    assert listed["kind"] == "ResourceSliceList"
    assert "kind" not in listed["items"][0]
    assert listed["metadata"]["resourceVersion"] == listed["items"][0]["metadata"]["resourceVersion"]


def test_cluster_wide_list_of_namespaced_claims(api: client.ResourceV1Api, core: client.CoreV1Api) -> None:
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-b"}})
    api.create_namespaced_resource_claim(NS, claim_body("c1"))
    api.create_namespaced_resource_claim("team-b", {**claim_body("c2"), "metadata": {"name": "c2"}})
    listed = api.list_resource_claim_for_all_namespaces().items
    assert [(c.metadata.namespace, c.metadata.name) for c in listed] == [(NS, "c1"), ("team-b", "c2")]
    assert [c.metadata.name for c in api.list_namespaced_resource_claim("team-b").items] == ["c2"]


# --------------------------------------------------------------------------- watch


def collect(stream: Iterator[dict[str, Any]], stop: watch.Watch, until: int) -> list[tuple[str, str]]:
    """Read events until ``until`` non-bookmark events arrived (the stream's own timeout bounds it)."""
    events: list[tuple[str, str]] = []
    for ev in stream:
        if ev["type"] != "BOOKMARK":
            events.append((ev["type"], ev["object"].metadata.name))
        if len(events) >= until:
            stop.stop()
    return events


def test_watch_from_resource_version_replays_only_later_events(api: client.ResourceV1Api) -> None:
    api.create_resource_slice(slice_body("before"))
    rv = api.list_resource_slice().metadata.resource_version
    api.create_resource_slice(slice_body("after"))
    api.patch_resource_slice("before", {"metadata": {"labels": {"x": "1"}}})
    api.delete_resource_slice("after")
    w = watch.Watch()
    stream = w.stream(api.list_resource_slice, resource_version=rv, timeout_seconds=10)
    assert collect(stream, w, 3) == [("ADDED", "after"), ("MODIFIED", "before"), ("DELETED", "after")]


def test_watch_without_resource_version_starts_with_synthetic_added(api: client.ResourceV1Api) -> None:
    api.create_resource_slice(slice_body("s1"))
    api.create_resource_slice(slice_body("s2"))
    w = watch.Watch()
    assert collect(w.stream(api.list_resource_slice, timeout_seconds=10), w, 2) == [
        ("ADDED", "s1"),
        ("ADDED", "s2"),
    ]


def test_watch_applies_field_selector(api: client.ResourceV1Api) -> None:
    rv = api.list_resource_slice().metadata.resource_version
    api.create_resource_slice(slice_body("b1", node="node-b"))
    api.create_resource_slice(slice_body("a1", node="node-a"))
    w = watch.Watch()
    stream = w.stream(
        api.list_resource_slice,
        field_selector="spec.nodeName=node-a",
        resource_version=rv,
        timeout_seconds=10,
    )
    assert collect(stream, w, 1) == [("ADDED", "a1")]


def test_watch_label_selector_transitions_become_added_and_deleted(api: client.ResourceV1Api) -> None:
    rv = api.list_resource_slice().metadata.resource_version
    api.create_resource_slice(slice_body("s1"))
    api.patch_resource_slice("s1", {"metadata": {"labels": {"tier": "gold"}}})
    api.patch_resource_slice("s1", {"metadata": {"labels": {"tier": "silver"}}})
    w = watch.Watch()
    stream = w.stream(
        api.list_resource_slice, label_selector="tier=gold", resource_version=rv, timeout_seconds=10
    )
    assert collect(stream, w, 2) == [("ADDED", "s1"), ("DELETED", "s1")]


def test_watch_sends_bookmarks_with_only_kind_api_version_and_resource_version(
    api: client.ResourceV1Api,
) -> None:
    api.create_resource_slice(slice_body("s1"))
    rv = api.list_resource_slice().metadata.resource_version
    w = watch.Watch()
    bookmark = None
    for ev in w.stream(
        api.list_resource_slice, resource_version=rv, allow_watch_bookmarks=True, timeout_seconds=20
    ):
        if ev["type"] == "BOOKMARK":
            bookmark = ev["object"]
            w.stop()
    assert bookmark == {
        "kind": "ResourceSlice",
        "apiVersion": "resource.k8s.io/v1",
        "metadata": {"resourceVersion": rv},
    }
    assert w.resource_version == rv


def test_watch_from_compacted_resource_version_is_410_gone(
    srv: FakeAPIServer, api: client.ResourceV1Api
) -> None:
    api.create_resource_slice(slice_body("s1"))
    old_rv = api.list_resource_slice().metadata.resource_version
    api.create_resource_slice(slice_body("s2"))
    srv.compact()
    api_client = srv.api_client()
    resp = client.ResourceV1Api(api_client).list_resource_slice(
        watch=True, resource_version=old_rv, _preload_content=False
    )
    lines = [line for line in resp.data.decode().splitlines() if line]
    assert len(lines) == 1
    event = json.loads(lines[0])
    assert event["type"] == "ERROR"
    assert (event["object"]["kind"], event["object"]["code"], event["object"]["reason"]) == (
        "Status",
        410,
        "Expired",
    )
    w = watch.Watch()
    with pytest.raises(ApiException) as err:
        list(w.stream(api.list_resource_slice, resource_version=old_rv))
    assert err.value.status == 410
    api_client.close()


def test_watch_history_bound_also_expires_old_versions(api: client.ResourceV1Api) -> None:
    start_rv = api.list_resource_slice().metadata.resource_version
    for i in range(101):  # watch_history=100 in the fixture
        api.create_resource_slice(slice_body(f"s{i}"))
    w = watch.Watch()
    with pytest.raises(ApiException) as err:
        list(w.stream(api.list_resource_slice, resource_version=start_rv, timeout_seconds=5))
    assert err.value.status == 410


def test_watch_timeout_seconds_ends_the_stream(api: client.ResourceV1Api) -> None:
    api.create_resource_slice(slice_body("s1"))
    events = list(watch.Watch().stream(api.list_resource_slice, timeout_seconds=1))
    assert [e["type"] for e in events] == ["ADDED"]


def test_send_initial_events_ends_with_annotated_bookmark(api: client.ResourceV1Api) -> None:
    api.create_resource_slice(slice_body("s1"))
    w = watch.Watch()
    seen = []
    for ev in w.stream(
        api.list_resource_slice,
        send_initial_events=True,
        resource_version_match="NotOlderThan",
        allow_watch_bookmarks=True,
        timeout_seconds=10,
    ):
        seen.append(ev["type"])
        if ev["type"] == "BOOKMARK":
            assert ev["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
            w.stop()
    assert seen == ["ADDED", "BOOKMARK"]


def test_stop_ends_open_watch_streams(api: client.ResourceV1Api) -> None:
    server = FakeAPIServer().start()
    api_client = server.api_client()
    ended: queue.Queue[list[str]] = queue.Queue()

    def consume() -> None:
        try:
            ended.put(
                [
                    e["type"]
                    for e in watch.Watch().stream(
                        client.ResourceV1Api(api_client).list_resource_slice, timeout_seconds=60
                    )
                ]
            )
        except Exception as exc:  # the stream may end with a connection error: that is fine too
            ended.put([type(exc).__name__])

    server.clear_request_log()
    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    wait_until(lambda: server.request_log() != [])
    server.stop()
    ended.get(timeout=30)
    thread.join(timeout=30)
    assert not thread.is_alive()
    api_client.close()


def wait_until(cond: Any, timeout: float = 10.0) -> None:
    ev = threading.Event()
    deadline = threading.Timer(timeout, ev.set)
    deadline.start()
    try:
        while not cond():
            if ev.wait(0.01):
                raise AssertionError("condition not met before the deadline")
    finally:
        deadline.cancel()


# --------------------------------------------------------------------------- status subresource


def test_main_resource_update_ignores_status(api: client.ResourceV1Api, core: client.CoreV1Api) -> None:
    claim = make_allocated_claim(api, "c1", "die-0")
    claim["metadata"]["labels"] = {"touched": "yes"}
    claim["status"] = {}
    stored = raw(api.replace_namespaced_resource_claim("c1", NS, claim, _preload_content=False))
    assert stored["metadata"]["labels"] == {"touched": "yes"}
    assert stored["status"]["allocation"]["devices"]["results"][0]["device"] == "die-0"
    patched = raw(api.patch_namespaced_resource_claim("c1", NS, {"status": None}, _preload_content=False))
    assert "allocation" in patched["status"]


def test_status_update_ignores_spec_and_metadata(api: client.ResourceV1Api, core: client.CoreV1Api) -> None:
    api.create_namespaced_resource_claim(NS, claim_body("c1"))
    body = {**claim_body("c1"), "status": allocated_status("die-0")}
    body["metadata"]["labels"] = {"sneaky": "yes"}
    body["spec"] = {"devices": {"requests": []}}
    stored = raw(api.replace_namespaced_resource_claim_status("c1", NS, body, _preload_content=False))
    assert "labels" not in stored["metadata"]
    assert stored["spec"]["devices"]["requests"][0]["name"] == "npu"
    assert stored["status"]["allocation"]["devices"]["results"][0]["device"] == "die-0"


def test_create_drops_claim_status(api: client.ResourceV1Api, core: client.CoreV1Api) -> None:
    body = {**claim_body("c1"), "status": allocated_status("die-0")}
    assert raw(api.create_namespaced_resource_claim(NS, body, _preload_content=False)).get("status") is None


# --------------------------------------------------------------------------- patches


def dev_status(device_name: str, **extra: Any) -> dict[str, Any]:
    return {"driver": DRIVER, "pool": "node-a", "device": device_name, **extra}


PATCH_CASES = [
    pytest.param(
        "application/merge-patch+json",
        {"status": {"devices": [dev_status("die-1", data={"v": 2})]}},
        [dev_status("die-1", data={"v": 2})],
        id="merge-patch-replaces-list",
    ),
    pytest.param(
        "application/strategic-merge-patch+json",
        {"status": {"devices": [dev_status("die-1", data={"v": 2})]}},
        [dev_status("die-1", data={"v": 2})],
        id="strategic-merge-replaces-devices-like-a-real-apiserver",
    ),
    pytest.param(
        "application/json-patch+json",
        [
            {"op": "test", "path": "/status/devices/0/device", "value": "die-0"},
            {"op": "add", "path": "/status/devices/-", "value": dev_status("die-1")},
        ],
        [dev_status("die-0", data={"v": 1}), dev_status("die-1")],
        id="json-patch-with-test",
    ),
]


@pytest.mark.parametrize(("content_type", "patch", "expected"), PATCH_CASES)
def test_patch_claim_status(
    api: client.ResourceV1Api,
    core: client.CoreV1Api,
    content_type: str,
    patch: Any,
    expected: list[dict[str, Any]],
) -> None:
    claim = make_allocated_claim(api, "c1", "die-0", "die-1")
    claim["status"]["devices"] = [dev_status("die-0", data={"v": 1})]
    api.replace_namespaced_resource_claim_status("c1", NS, claim)
    out = raw(
        api.patch_namespaced_resource_claim_status(
            "c1", NS, patch, _content_type=content_type, _preload_content=False
        )
    )
    assert out["status"]["devices"] == expected


def test_strategic_merge_merges_reserved_for_by_uid(
    api: client.ResourceV1Api, core: client.CoreV1Api
) -> None:
    make_allocated_claim(api, "c1", "die-0")
    ref1 = {"resource": "pods", "name": "p1", "uid": "u1"}
    ref2 = {"resource": "pods", "name": "p2", "uid": "u2"}
    api.patch_namespaced_resource_claim_status(
        "c1", NS, {"status": {"reservedFor": [ref1]}}
    )  # default: strategic
    out = api.patch_namespaced_resource_claim_status("c1", NS, {"status": {"reservedFor": [ref2]}})
    assert [r.uid for r in out.status.reserved_for] == ["u1", "u2"]
    out = api.patch_namespaced_resource_claim_status(
        "c1", NS, {"status": {"reservedFor": [{"uid": "u1", "$patch": "delete"}]}}
    )
    assert [r.uid for r in out.status.reserved_for] == ["u2"]


def test_failed_json_patch_test_is_unprocessable(api: client.ResourceV1Api, core: client.CoreV1Api) -> None:
    make_allocated_claim(api, "c1", "die-0")
    with pytest.raises(ApiException) as err:
        api.patch_namespaced_resource_claim_status(
            "c1",
            NS,
            [{"op": "test", "path": "/metadata/resourceVersion", "value": "1"}],
            _content_type="application/json-patch+json",
        )
    assert err.value.status == 422


def test_patch_with_stale_resource_version_conflicts(api: client.ResourceV1Api) -> None:
    api.create_resource_slice(slice_body("s1"))
    with pytest.raises(ApiException) as err:
        api.patch_resource_slice(
            "s1",
            {"metadata": {"resourceVersion": "1", "labels": {"a": "b"}}},
            _content_type="application/merge-patch+json",
        )
    assert err.value.status == 409


def apply_status(api: client.ResourceV1Api, manager: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c1", "namespace": NS},
        "status": {"devices": devices},
    }
    return raw(
        api.patch_namespaced_resource_claim_status(
            "c1",
            NS,
            body,
            field_manager=manager,
            force=True,
            _content_type="application/apply-patch+yaml",
            _preload_content=False,
        )
    )


def test_apply_status_merges_devices_by_key_across_managers(
    api: client.ResourceV1Api, core: client.CoreV1Api
) -> None:
    make_allocated_claim(api, "c1", "die-0", "die-1")
    apply_status(api, "driver-a", [dev_status("die-0", data={"v": 1})])
    out = apply_status(api, "driver-b", [dev_status("die-1", data={"v": 2})])
    assert out["status"]["devices"] == [
        dev_status("die-0", data={"v": 1}),
        dev_status("die-1", data={"v": 2}),
    ]
    assert out["status"]["allocation"]["devices"]["results"][0]["device"] == "die-0"


def test_apply_removes_the_managers_own_stale_entry_and_keeps_others(
    api: client.ResourceV1Api, core: client.CoreV1Api
) -> None:
    make_allocated_claim(api, "c1", "die-0", "die-1")
    apply_status(api, "driver-a", [dev_status("die-0", data={"v": 1})])
    apply_status(api, "driver-b", [dev_status("die-1")])
    out = apply_status(api, "driver-a", [])
    assert out["status"]["devices"] == [dev_status("die-1")]
    out = apply_status(api, "driver-b", [])
    assert "devices" not in out["status"]


def test_apply_conflict_without_force(api: client.ResourceV1Api, core: client.CoreV1Api) -> None:
    make_allocated_claim(api, "c1", "die-0")
    apply_status(api, "driver-a", [dev_status("die-0", data={"v": 1})])
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c1"},
        "status": {"devices": [dev_status("die-0", data={"v": 2})]},
    }
    with pytest.raises(ApiException) as err:
        api.patch_namespaced_resource_claim_status(
            "c1", NS, body, field_manager="other", _content_type="application/apply-patch+yaml"
        )
    assert err.value.status == 409
    assert status_of(err.value)["details"]["causes"][0]["reason"] == "FieldManagerConflict"


def test_apply_requires_field_manager(api: client.ResourceV1Api, core: client.CoreV1Api) -> None:
    make_allocated_claim(api, "c1", "die-0")
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c1"},
        "status": {},
    }
    with pytest.raises(ApiException) as err:
        api.patch_namespaced_resource_claim_status(
            "c1", NS, body, _content_type="application/apply-patch+yaml"
        )
    assert err.value.status == 400


def test_apply_creates_a_missing_object(api: client.ResourceV1Api) -> None:
    body = slice_body("s1")
    created = api.patch_resource_slice(
        "s1", body, field_manager="publisher", _content_type="application/apply-patch+yaml"
    )
    assert created.spec.devices[0].name == "die-0"


# --------------------------------------------------------------------------- validation


def many(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [device(f"d{i}", **extra) for i in range(n)]


COUNTERS = {"consumesCounters": [{"counterSet": "die", "counters": {"mem": {"value": "1"}}}]}

VALIDATION_CASES = [
    pytest.param(
        slice_body("s", devices=[device("x" * 64)]), "spec.devices[0].name", id="device-name-over-63"
    ),
    pytest.param(
        slice_body("s", devices=[device("Die_0")]), "spec.devices[0].name", id="device-name-not-dns-label"
    ),
    pytest.param(
        slice_body("s", devices=[device("a"), device("a")]), "spec.devices[1].name", id="duplicate-device"
    ),
    pytest.param(slice_body("s", allNodes=True), "spec", id="node-name-and-all-nodes"),
    pytest.param(slice_body("s", node=""), "spec", id="no-node-selection"),
    pytest.param(slice_body("s", devices=many(129)), "spec.devices", id="129-devices"),
    pytest.param(
        slice_body("s", devices=many(65, **COUNTERS)), "spec.devices", id="65-devices-with-counters"
    ),
    pytest.param(
        slice_body("s", sharedCounters=[{"name": "die", "counters": {"mem": {"value": "1"}}}]),
        "spec",
        id="devices-and-shared-counters",
    ),
    pytest.param(
        slice_body("s", devices=[device("a", attributes={f"a{i}": {"int": i} for i in range(33)})]),
        "spec.devices[0]",
        id="33-attributes",
    ),
    pytest.param(
        slice_body("s", devices=[device("a", attributes={"x": {"int": 1, "string": "1"}})]),
        "spec.devices[0].attributes[x]",
        id="two-values",
    ),
    pytest.param(
        slice_body("s", devices=[device("a", attributes={"x": {"string": "s" * 65}})]),
        "spec.devices[0].attributes[x].string",
        id="string-over-64",
    ),
    pytest.param(
        slice_body("s", devices=[device("a", attributes={"x": {"version": "1.0"}})]),
        "spec.devices[0].attributes[x].version",
        id="bad-semver",
    ),
    pytest.param(
        slice_body(
            "s",
            devices=[device("a", capacity={"memory": {"value": "1Gi", "requestPolicy": {"default": "1Gi"}}})],
        ),
        "spec.devices[0].capacity[memory].requestPolicy",
        id="request-policy-without-multi-alloc",
    ),
    pytest.param(
        {
            **slice_body("s"),
            "spec": {
                **slice_body("s")["spec"],
                "pool": {"name": "p", "generation": 0, "resourceSliceCount": 0},
            },
        },
        "spec.pool.resourceSliceCount",
        id="pool-count-zero",
    ),
    pytest.param(slice_body("s", driver="Bad_Driver"), "spec.driver", id="bad-driver-name"),
]


@pytest.mark.parametrize(("body", "field"), VALIDATION_CASES)
def test_invalid_resource_slice_is_422_naming_the_field(
    api: client.ResourceV1Api, body: dict[str, Any], field: str
) -> None:
    with pytest.raises(ApiException) as err:
        api.create_resource_slice(body)
    status = status_of(err.value)
    assert (err.value.status, status["reason"], status["details"]["kind"]) == (
        422,
        "Invalid",
        "ResourceSlice",
    )
    assert field in [c["field"] for c in status["details"]["causes"]]


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        pytest.param({"spec": {"nodeName": "node-z"}}, "spec.nodeName", id="node-name"),
        pytest.param({"spec": {"driver": "gpu.example.com"}}, "spec.driver", id="driver"),
        pytest.param({"spec": {"pool": {"name": "other"}}}, "spec.pool.name", id="pool-name"),
    ],
)
def test_resource_slice_immutable_fields(
    api: client.ResourceV1Api, patch: dict[str, Any], field: str
) -> None:
    api.create_resource_slice(slice_body("s1"))
    with pytest.raises(ApiException) as err:
        api.patch_resource_slice("s1", patch, _content_type="application/merge-patch+json")
    assert err.value.status == 422
    assert [c["field"] for c in status_of(err.value)["details"]["causes"]] == [field]


def test_valid_partitionable_slices_are_accepted(api: client.ResourceV1Api) -> None:
    api.create_resource_slice(
        slice_body(
            "counters", devices=[], sharedCounters=[{"name": "die", "counters": {"mem": {"value": "64Gi"}}}]
        )
    )
    api.create_resource_slice(slice_body("devs", devices=many(64, **COUNTERS)))
    assert len(api.list_resource_slice().items) == 2


def test_claim_status_devices_must_be_allocated(api: client.ResourceV1Api, core: client.CoreV1Api) -> None:
    make_allocated_claim(api, "c1", "die-0")
    with pytest.raises(ApiException) as err:
        api.patch_namespaced_resource_claim_status("c1", NS, {"status": {"devices": [dev_status("die-7")]}})
    assert err.value.status == 422
    assert status_of(err.value)["details"]["causes"][0]["field"] == "status.devices[0]"


def test_claim_spec_is_immutable(api: client.ResourceV1Api, core: client.CoreV1Api) -> None:
    api.create_namespaced_resource_claim(NS, claim_body("c1"))
    with pytest.raises(ApiException) as err:
        api.patch_namespaced_resource_claim(
            "c1", NS, {"spec": {"devices": {"requests": []}}}, _content_type="application/merge-patch+json"
        )
    assert err.value.status == 422


def test_quantities_are_stored_in_canonical_form(api: client.ResourceV1Api) -> None:
    caps = {
        "memory": {"value": "1024Mi"},
        "compute": {"value": "100"},
        "big": {"value": "2000"},
        "half": {"value": "0.5"},
    }
    created = raw(
        api.create_resource_slice(
            slice_body("s1", devices=[device("d", capacity=caps)]), _preload_content=False
        )
    )
    stored = {k: v["value"] for k, v in created["spec"]["devices"][0]["capacity"].items()}
    assert stored == {"memory": "1Gi", "compute": "100", "big": "2k", "half": "500m"}


# --------------------------------------------------------------------------- outages and feature gates


def test_set_down_returns_503_closes_watches_and_recovers(
    srv: FakeAPIServer, api: client.ResourceV1Api
) -> None:
    api.create_resource_slice(slice_body("s1"))
    got: queue.Queue[str] = queue.Queue()
    api_client = srv.api_client()

    def consume() -> None:
        try:
            for ev in watch.Watch().stream(
                client.ResourceV1Api(api_client).list_resource_slice, resource_version="0"
            ):
                got.put(ev["type"])
        except ApiException as exc:
            got.put(f"error-{exc.status}")

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    assert got.get(timeout=10) == "ADDED"
    srv.set_down(True)
    assert got.get(timeout=10) == "error-503"  # stream closed, the client's re-watch got 503
    with pytest.raises(ApiException) as err:
        api.read_resource_slice("s1")
    assert err.value.status == 503
    assert status_of(err.value)["reason"] == "ServiceUnavailable"
    srv.set_down(False)
    assert api.read_resource_slice("s1").metadata.name == "s1"
    thread.join(timeout=10)
    api_client.close()


def test_drop_partitionable_fields(srv: FakeAPIServer, api: client.ResourceV1Api) -> None:
    srv.drop_partitionable_fields = True
    created = raw(
        api.create_resource_slice(
            slice_body("devs", devices=[device("a", **COUNTERS)]), _preload_content=False
        )
    )
    assert "consumesCounters" not in created["spec"]["devices"][0]
    counters_only = slice_body(
        "ctr", devices=[], sharedCounters=[{"name": "die", "counters": {"mem": {"value": "1"}}}]
    )
    stored = raw(api.create_resource_slice(counters_only, _preload_content=False))
    assert "sharedCounters" not in stored["spec"]
    with pytest.raises(ApiException) as err:  # nothing left to select nodes: invalid, like the real server
        api.create_resource_slice(
            slice_body("pdns", node="", perDeviceNodeSelection=True, devices=[device("a", nodeName="n")])
        )
    assert err.value.status == 422


def test_request_log_records_every_request(srv: FakeAPIServer, api: client.ResourceV1Api) -> None:
    srv.clear_request_log()
    api.list_resource_slice()
    api.create_resource_slice(slice_body("s1"))
    assert srv.request_log() == [
        ("GET", "/apis/resource.k8s.io/v1/resourceslices"),
        ("POST", "/apis/resource.k8s.io/v1/resourceslices"),
    ]
    assert srv.get_object("resourceslices", "s1")["spec"]["driver"] == DRIVER  # type: ignore[index]
    assert srv.get_object("resourceslices", "nope") is None


def test_discovery_and_health(srv: FakeAPIServer, api: client.ResourceV1Api) -> None:
    resources = api.get_api_resources()
    names = {r.name for r in resources.resources}
    assert {
        "resourceslices",
        "resourceclaims",
        "resourceclaims/status",
        "resourceclaimtemplates",
        "deviceclasses",
    } <= names
    api_client = srv.api_client()
    assert client.VersionApi(api_client).get_code().major == "1"
    assert "resource.k8s.io" in {g.name for g in client.ApisApi(api_client).get_api_versions().groups}
    assert client.CoreApi(api_client).get_api_versions().versions == ["v1"]
    api_client.close()


def test_events_both_groups(srv: FakeAPIServer, core: client.CoreV1Api) -> None:
    core.create_namespaced_event(
        NS,
        {
            "metadata": {"generateName": "ev-"},
            "involvedObject": {"kind": "Pod", "name": "p1", "namespace": NS},
            "reason": "Prepared",
        },
    )
    listed = core.list_namespaced_event(NS, field_selector="involvedObject.name=p1,reason=Prepared").items
    assert len(listed) == 1
    events_api = client.EventsV1Api(srv.api_client())
    events_api.create_namespaced_event(
        NS,
        {
            "metadata": {"name": "e2"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "regarding": {"kind": "Pod", "name": "p2"},
            "reason": "R",
            "action": "A",
            "reportingController": "c",
            "reportingInstance": "i",
        },
    )
    assert [
        e.metadata.name
        for e in events_api.list_namespaced_event(NS, field_selector="regarding.name=p2").items
    ] == ["e2"]


# --------------------------------------------------------------------------- standalone process


def test_standalone_process_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flexnpu_testing.fake_apiserver",
            "--port",
            "0",
            "--kubeconfig-out",
            str(kubeconfig),
        ],
        env=pythonpath_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
        api_client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        names = [n.metadata.name for n in client.CoreV1Api(api_client).list_namespace().items]
        assert "default" in names
        api_client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


def test_send_initial_events_false_starts_at_the_current_state(api: client.ResourceV1Api) -> None:
    api.create_resource_slice(slice_body("before"))
    # with _preload_content=False the call returns once the headers arrived, i.e. once the watch is registered
    resp = api.list_resource_slice(
        watch=True, send_initial_events=False, timeout_seconds=3, _preload_content=False
    )
    api.create_resource_slice(slice_body("after"))
    events = [json.loads(line) for line in resp.data.decode().splitlines() if line]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "after")]


def test_pods_minimal_crud_and_node_field_selector(core: client.CoreV1Api) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p1"},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "i"}]},
    }
    created = core.create_namespaced_pod(NS, pod)
    assert created.status.phase == "Pending"
    assert [
        p.metadata.name for p in core.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-a").items
    ] == ["p1"]
    assert core.list_namespaced_pod(NS, field_selector="spec.nodeName=node-b").items == []
    deleted = core.delete_namespaced_pod("p1", NS)
    assert deleted.metadata.uid == created.metadata.uid


def test_shared_informer_relists_after_410(srv: FakeAPIServer, api: client.ResourceV1Api) -> None:
    """The official client's SharedInformer: list, watch, outage, 410 Gone, relist."""
    from kubernetes.informer import SharedInformer

    added: queue.Queue[str] = queue.Queue()
    informer = SharedInformer(api.list_resource_slice)
    informer.add_event_handler("ADDED", lambda obj: added.put(obj.metadata.name))
    informer.start()
    try:
        api.create_resource_slice(slice_body("s1"))
        assert added.get(timeout=10) == "s1"
        srv.set_down(True)
        srv.put_object("resourceslices", slice_body("s2"))  # happens while the informer cannot watch
        srv.compact()
        srv.set_down(False)
        assert added.get(timeout=20) == "s2"  # only a relist can have found it
        assert sorted(o.metadata.name for o in informer.cache.list()) == ["s1", "s2"]
    finally:
        # SharedInformer.stop() can miss a watch opened right after a relist and then blocks on
        # the idle stream; going down ends every stream, so the join cannot hang.
        srv.set_down(True)
        informer.stop()
        srv.set_down(False)


def test_deleting_a_node_collects_its_owned_slices(api: client.ResourceV1Api, core: client.CoreV1Api) -> None:
    node = core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    other = core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-b"}})

    def owned_by(*nodes: Any) -> list[dict[str, Any]]:
        return [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": n.metadata.name,
                "uid": n.metadata.uid,
                "controller": i == 0,
            }
            for i, n in enumerate(nodes)
        ]

    for name, owners in (("only-a", owned_by(node)), ("a-and-b", owned_by(node, other)), ("none", [])):
        body = slice_body(name)
        if owners:
            body["metadata"]["ownerReferences"] = owners
        api.create_resource_slice(body)
    assert (
        api.read_resource_slice("only-a").metadata.owner_references[0].uid == node.metadata.uid
    )  # kept as sent
    core.delete_node("node-a")
    assert sorted(s.metadata.name for s in api.list_resource_slice().items) == ["a-and-b", "none"]
    core.delete_node("node-b", body=client.V1DeleteOptions(propagation_policy="Orphan"))
    assert sorted(s.metadata.name for s in api.list_resource_slice().items) == ["a-and-b", "none"]


@pytest.mark.parametrize(
    ("how", "code"),
    [
        pytest.param("put", 409, id="put-uid-is-a-precondition"),
        pytest.param("merge", 422, id="merge-patch-uid-is-immutable"),
        pytest.param("apply", 422, id="apply-uid-is-immutable"),
    ],
)
def test_write_naming_another_uid_is_refused(
    api: client.ResourceV1Api, core: client.CoreV1Api, how: str, code: int
) -> None:
    """A claim deleted and re-created under the same name must not receive the old claim's status."""
    make_allocated_claim(api, "c1", "die-0")
    body = {**claim_body("c1"), "status": {"devices": [dev_status("die-0")]}}
    body["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
    with pytest.raises(ApiException) as err:
        if how == "put":
            api.replace_namespaced_resource_claim_status("c1", NS, body)
        elif how == "merge":
            api.patch_namespaced_resource_claim_status(
                "c1", NS, body, _content_type="application/merge-patch+json"
            )
        else:
            api.patch_namespaced_resource_claim_status(
                "c1", NS, body, field_manager="m", force=True, _content_type="application/apply-patch+yaml"
            )
    assert err.value.status == code
    assert api.read_namespaced_resource_claim("c1", NS).status.devices is None


def test_raw_watch_is_chunked_json_lines_and_dry_run_is_refused(
    srv: FakeAPIServer, api: client.ResourceV1Api
) -> None:
    import http.client
    from urllib.parse import urlsplit

    api.create_resource_slice(slice_body("s1"))
    api.create_resource_slice(slice_body("s2"))
    url = urlsplit(srv.url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port)
    conn.request("GET", "/apis/resource.k8s.io/v1/resourceslices?watch=1&timeoutSeconds=1")
    resp = conn.getresponse()
    assert resp.getheader("Transfer-Encoding") == "chunked"
    lines = resp.read().decode().splitlines()
    assert [json.loads(line)["object"]["metadata"]["name"] for line in lines] == ["s1", "s2"]
    conn.close()
    with pytest.raises(ApiException) as err:
        api.create_resource_slice(slice_body("s3"), dry_run="All")
    assert err.value.status == 400
    assert srv.get_object("resourceslices", "s3") is None


def test_limit_pages_a_list_with_continue_tokens(srv: FakeAPIServer, api: client.ResourceV1Api) -> None:
    names = [f"s{i}" for i in range(5)]
    for name in names:
        api.create_resource_slice(slice_body(name))
    first = json.loads(api.list_resource_slice(limit=2, _preload_content=False).data)
    assert [i["metadata"]["name"] for i in first["items"]] == names[:2]
    assert first["metadata"]["remainingItemCount"] == 3 and first["metadata"]["continue"]
    api.create_resource_slice(slice_body("s9"))  # written after the first page
    seen = [i["metadata"]["name"] for i in first["items"]]
    token = first["metadata"]["continue"]
    while token:
        page = json.loads(api.list_resource_slice(limit=2, _continue=token, _preload_content=False).data)
        assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        seen += [i["metadata"]["name"] for i in page["items"]]
        token = page["metadata"].get("continue")
    assert seen == [*names, "s9"]
    one = json.loads(api.list_resource_slice(limit=1, _preload_content=False).data)
    assert len(one["items"]) == 1 and int(one["metadata"]["resourceVersion"]) == srv.resource_version()


def test_a_continue_token_older_than_the_history_is_expired(
    srv: FakeAPIServer, api: client.ResourceV1Api
) -> None:
    for name in ("a", "b"):
        api.create_resource_slice(slice_body(name))
    token = json.loads(api.list_resource_slice(limit=1, _preload_content=False).data)["metadata"]["continue"]
    api.create_resource_slice(slice_body("c"))
    srv.compact()
    with pytest.raises(ApiException) as info:
        api.list_resource_slice(limit=1, _continue=token)
    assert info.value.status == 410
