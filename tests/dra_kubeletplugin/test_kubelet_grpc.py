"""The helper's gRPC face over real unix sockets, driven by the kubelet simulator, claims from the fake API server.

The driver and the health source are small in-test fakes standing in for a driver; everything
between them and the simulator (sockets, gRPC servers, registration, claim fetching, streams) is
the helper's real code, and the claims are real objects of the fake API server.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

import dra_kubeletplugin
from dra_kubeletplugin import errors
from dra_kubeletplugin.claims import (
    ClaimRef,
    DeviceHealthReport,
    PreparedDevice,
    PrepareResult,
    ResourceClaim,
)
from dra_kubeletplugin.helper import Helper
from dra_kubeletplugin.kubeapi import KubeClient
from dra_kubeletplugin.protos.gen import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc
from flexnpu_testing import pythonpath_env
from flexnpu_testing.fake_apiserver import FakeAPIServer
from flexnpu_testing.kubelet import KubeletError, KubeletSimulator, RegistrationRejected
from tests.dra_kubeletplugin.conftest import DRIVER, NAMESPACE, NODE, ClaimMaker

WAIT = 10.0


class FakeDriver:
    """Prepares every claim to one device; ``fail_next`` makes the next call raise."""

    def __init__(self) -> None:
        self.prepared: dict[str, ResourceClaim] = {}
        self.fail_next: BaseException | None = None
        self.omit: set[str] = set()
        self.calls: list[tuple[str, list[str]]] = []

    def prepare_resource_claims(self, claims: Sequence[ResourceClaim]) -> Mapping[str, PrepareResult]:
        self.calls.append(("prepare", [c.uid for c in claims]))
        self._maybe_fail()
        out: dict[str, PrepareResult] = {}
        for c in claims:
            if c.uid in self.omit:
                continue
            self.prepared[c.uid] = c
            (result,) = c.results(DRIVER)
            device = PreparedDevice(
                request_names=("req/sub-0", "req/sub-1", "req"),
                pool=str(result["pool"]),
                device=str(result["device"]),
                cdi_device_ids=(f"{DRIVER}/dev={c.uid}",),
                share_id=f"share-{c.uid}",
            )
            out[c.uid] = PrepareResult(devices=(device,))
        return out

    def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        self.calls.append(("unprepare", [c.uid for c in claims]))
        self._maybe_fail()
        for c in claims:
            self.prepared.pop(c.uid, None)
        return {c.uid: "" for c in claims if c.uid not in self.omit}

    def _maybe_fail(self) -> None:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc


class FakeHealth:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reports = [
            DeviceHealthReport(pool=NODE, device="dev-0", healthy=True),
            DeviceHealthReport(pool=NODE, device="dev-1", healthy=True),
        ]

    fail: BaseException | None = None

    def set(self, reports: list[DeviceHealthReport]) -> None:
        with self._lock:
            self.reports = reports

    def device_health(self) -> list[DeviceHealthReport]:
        with self._lock:
            if self.fail is not None:
                raise self.fail
            return list(self.reports)


@dataclass
class Plugin:
    helper: Helper
    driver: FakeDriver
    health: FakeHealth
    registry_dir: Path
    dra_socket: Path
    reg_socket: Path
    api: FakeAPIServer
    a: ClaimRef
    b: ClaimRef


def _make_plugin(
    short_tmp: Path,
    kube: KubeClient,
    api: FakeAPIServer,
    make_claim: ClaimMaker,
    *,
    resend_seconds: float = 10.0,
    with_health: bool = True,
    pod_uid: str | None = None,
) -> Plugin:
    driver, source = FakeDriver(), FakeHealth()
    helper = dra_kubeletplugin.start(
        driver,
        driver_name=DRIVER,
        node_name=NODE,
        kube=kube,
        pod_uid=pod_uid,
        registry_dir=short_tmp / "plugins_registry",
        plugins_dir=short_tmp / "plugins",
        health_source=source if with_health else None,
        fetch_workers=2,
        max_workers=8,
        health_resend_seconds=resend_seconds,
        serve=False,
    )
    paths = helper.paths
    a, b = (
        make_claim("claim-a", devices=[(DRIVER, "dev-0")]),
        make_claim("claim-b", devices=[(DRIVER, "dev-1")]),
    )
    return Plugin(helper, driver, source, paths.registration.parent, paths.dra, paths.registration, api, a, b)


@pytest.fixture
def plugin(short_tmp: Path, kube: KubeClient, api: FakeAPIServer, make_claim: ClaimMaker) -> Iterator[Plugin]:
    p = _make_plugin(short_tmp, kube, api, make_claim)
    p.helper.start()
    try:
        yield p
    finally:
        p.helper.stop(grace=1)


API_VERSIONS = pytest.mark.parametrize(
    ("kubelet_services", "expected_service", "has_share_id"),
    [
        pytest.param(("v1.DRAPlugin", "v1beta1.DRAPlugin"), "v1.DRAPlugin", True, id="v1"),
        pytest.param(("v1beta1.DRAPlugin",), "v1beta1.DRAPlugin", False, id="v1beta1"),
    ],
)


def test_getinfo_fields_exact(plugin: Plugin) -> None:
    with grpc.insecure_channel(f"unix:{plugin.reg_socket}") as channel:
        info = pluginregistration_v1_pb2_grpc.RegistrationStub(channel).GetInfo(
            pluginregistration_v1_pb2.InfoRequest(), timeout=WAIT
        )
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(plugin.dra_socket)
    assert os.path.isabs(info.endpoint)
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]


def test_sockets_are_private_sockets(plugin: Plugin) -> None:
    for path in (plugin.dra_socket, plugin.reg_socket):
        mode = path.stat().st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600


@API_VERSIONS
def test_register_prepare_unprepare(
    plugin: Plugin, kubelet_services: tuple[str, ...], expected_service: str, has_share_id: bool
) -> None:
    kubelet = KubeletSimulator(plugin.registry_dir, supported_services=kubelet_services)
    with kubelet.wait_for_plugin(DRIVER, WAIT) as handle:
        assert handle.service == expected_service
        assert plugin.helper.server.registration.registered.wait(WAIT)
        assert plugin.helper.server.registration.last_error == ""

        a, b = plugin.a, plugin.b
        results = handle.prepare([a, b])
        assert set(results) == {a.uid, b.uid}
        for ref, dev in ((a, "dev-0"), (b, "dev-1")):
            (device,) = results[ref.uid].devices
            assert results[ref.uid].error == ""
            assert device.request_names == ("req",)
            assert (device.pool, device.device) == (NODE, dev)
            assert device.cdi_device_ids == (f"{DRIVER}/dev={ref.uid}",)
            assert device.share_id == (f"share-{ref.uid}" if has_share_id else None)
        assert set(plugin.driver.prepared) == {a.uid, b.uid}
        assert (
            plugin.driver.prepared[a.uid].obj["metadata"]["name"] == "claim-a"
        )  # the claim as the API has it

        assert handle.unprepare([a, b]) == {a.uid: "", b.uid: ""}
        assert plugin.driver.prepared == {}


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        pytest.param(ClaimRef(namespace="ns", uid="", name="claim-x"), "claim.uid", id="empty-uid"),
        pytest.param(ClaimRef(namespace="ns", uid="a/b", name="claim-x"), "claim.uid", id="uid-with-slash"),
        pytest.param(ClaimRef(namespace="ns", uid="u" * 200, name="claim-x"), "claim.uid", id="uid-too-long"),
        pytest.param(
            ClaimRef(namespace="", uid="uid-x", name="claim-x"), "claim.namespace", id="empty-namespace"
        ),
        pytest.param(
            ClaimRef(namespace="NS", uid="uid-x", name="claim-x"), "claim.namespace", id="bad-namespace"
        ),
        pytest.param(ClaimRef(namespace="ns", uid="uid-x", name=""), "claim.name", id="empty-name"),
    ],
)
def test_malformed_claim_gets_its_own_error_without_an_api_call(
    plugin: Plugin, bad: ClaimRef, field: str
) -> None:
    a = plugin.a
    with KubeletSimulator(plugin.registry_dir).wait_for_plugin(DRIVER, WAIT) as handle:
        plugin.api.clear_request_log()
        results = handle.prepare([bad, a])
        assert field in results[bad.uid].error
        assert results[bad.uid].devices == ()
        assert results[a.uid].error == ""
        assert len(results[a.uid].devices) == 1
        assert [p for _, p in plugin.api.request_log() if "resourceclaims" in p] == [
            f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/claim-a"
        ]
        unprepared = handle.unprepare([bad, a])
        assert field in unprepared[bad.uid]
        assert unprepared[a.uid] == ""
    assert bad.uid not in plugin.driver.prepared


def test_missing_result_from_the_driver_is_filled(plugin: Plugin) -> None:
    a, b = plugin.a, plugin.b
    plugin.driver.omit = {b.uid}
    with KubeletSimulator(plugin.registry_dir).wait_for_plugin(DRIVER, WAIT) as handle:
        results = handle.prepare([a, b])
        assert results[a.uid].error == ""
        assert "no prepare result" in results[b.uid].error
        unprepared = handle.unprepare([a, b])
        assert unprepared[a.uid] == ""
        assert "no unprepare result" in unprepared[b.uid]


@pytest.mark.parametrize(
    ("exc", "code", "text"),
    [
        pytest.param(
            RuntimeError("boom in the domain"), grpc.StatusCode.INTERNAL, "boom in the domain", id="bug"
        ),
        pytest.param(
            errors.ApiUnavailable("backend down"),
            grpc.StatusCode.UNAVAILABLE,
            "backend down",
            id="unavailable",
        ),
    ],
)
@pytest.mark.parametrize("verb", ["prepare", "unprepare"])
def test_driver_exception_maps_to_status_and_server_survives(
    plugin: Plugin, exc: BaseException, code: grpc.StatusCode, text: str, verb: str
) -> None:
    a = plugin.a
    with KubeletSimulator(plugin.registry_dir).wait_for_plugin(DRIVER, WAIT) as handle:
        call = getattr(handle, verb)
        plugin.driver.fail_next = exc
        with pytest.raises(KubeletError) as info:
            call([a])
        assert info.value.code == code
        assert text in str(info.value)
        results = call([a])
        assert set(results) == {a.uid}


@pytest.mark.parametrize("service", ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth", None])
def test_health_stream_sends_set_then_updates(plugin: Plugin, service: str | None) -> None:
    with KubeletSimulator(plugin.registry_dir).wait_for_plugin(DRIVER, WAIT) as handle:
        watch = handle.watch_health(service)
        try:
            assert watch.service == (service or "v1.DRAResourceHealth")
            first = watch.next(WAIT)
            assert [(d.device, d.healthy) for d in first.devices] == [("dev-0", True), ("dev-1", True)]
            assert {d.health_check_timeout_seconds for d in first.raw.devices} == {30}
            assert all(d.last_updated_time > 0 for d in first.raw.devices)

            plugin.health.set(
                [
                    DeviceHealthReport(pool=NODE, device="dev-0", healthy=True),
                    DeviceHealthReport(pool=NODE, device="dev-1", healthy=False, message="x" * 3000),
                ]
            )
            plugin.helper.notify_health_changed()
            update = watch.next(WAIT)
            while update.devices[1].healthy is not False:  # a periodic resend may come first
                update = watch.next(WAIT)
            assert update.devices[1].healthy is False
            assert len(update.devices[1].message) == 1024
        finally:
            watch.close()
        assert watch.ended.wait(WAIT)


def test_health_source_failure_ends_stream_with_status(plugin: Plugin) -> None:
    with KubeletSimulator(plugin.registry_dir).wait_for_plugin(DRIVER, WAIT) as handle:
        watch = handle.watch_health()
        try:
            watch.next(WAIT)
            plugin.health.fail = RuntimeError("sensor read failed")
            plugin.helper.notify_health_changed()
            assert watch.ended.wait(WAIT)
            assert watch.end_code == grpc.StatusCode.INTERNAL
            assert "sensor read failed" in watch.end_details
        finally:
            watch.close()
        plugin.health.fail = None
        assert handle.prepare([plugin.a])[plugin.a.uid].error == ""  # the server is still serving
        again = handle.watch_health()
        try:
            assert len(again.next(WAIT).devices) == 2
        finally:
            again.close()


def test_health_stream_resends_periodically(
    short_tmp: Path, kube: KubeClient, api: FakeAPIServer, make_claim: ClaimMaker
) -> None:
    p = _make_plugin(short_tmp, kube, api, make_claim, resend_seconds=0.2)
    p.helper.start()
    try:
        with KubeletSimulator(p.registry_dir).wait_for_plugin(DRIVER, WAIT) as handle:
            watch = handle.watch_health()
            try:
                updates = [watch.next(WAIT) for _ in range(3)]  # no notify_changed: resends only
            finally:
                watch.close()
        assert all(len(u.devices) == 2 for u in updates)
    finally:
        p.helper.stop(grace=1)


def test_health_stream_ends_cleanly_on_stop(
    short_tmp: Path, kube: KubeClient, api: FakeAPIServer, make_claim: ClaimMaker
) -> None:
    p = _make_plugin(short_tmp, kube, api, make_claim)
    p.helper.start()
    try:
        handle = KubeletSimulator(p.registry_dir).wait_for_plugin(DRIVER, WAIT)
        watch = handle.watch_health("v1alpha1.DRAResourceHealth")
        watch.next(WAIT)
    finally:
        p.helper.stop(grace=1)
    try:
        assert watch.ended.wait(WAIT)
        assert watch.end_code == grpc.StatusCode.OK
    finally:
        watch.close()
        handle.close()


def test_no_health_source_advertises_no_health(
    short_tmp: Path, kube: KubeClient, api: FakeAPIServer, make_claim: ClaimMaker
) -> None:
    p = _make_plugin(short_tmp, kube, api, make_claim, with_health=False)
    p.helper.start()
    try:
        with KubeletSimulator(p.registry_dir).wait_for_plugin(DRIVER, WAIT) as handle:
            assert handle.info.supported_versions == ("v1.DRAPlugin", "v1beta1.DRAPlugin")
            with pytest.raises(KubeletError, match="no health service"):
                handle.watch_health()
            watch = handle.watch_health("v1.DRAResourceHealth")
            assert watch.ended.wait(WAIT)
            assert watch.end_code == grpc.StatusCode.UNIMPLEMENTED
            watch.close()
    finally:
        p.helper.stop(grace=1)


def test_sockets_removed_after_stop_and_stale_ones_replaced(
    short_tmp: Path, kube: KubeClient, api: FakeAPIServer, make_claim: ClaimMaker
) -> None:
    p = _make_plugin(short_tmp, kube, api, make_claim)
    for path in (p.dra_socket, p.reg_socket):  # leftovers of a crashed instance
        path.parent.mkdir(parents=True, exist_ok=True)
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(str(path))
        stale.close()
    p.helper.start()
    try:
        with KubeletSimulator(p.registry_dir).wait_for_plugin(DRIVER, WAIT) as handle:
            assert handle.prepare([p.a])[p.a.uid].error == ""
    finally:
        p.helper.stop(grace=1)
    assert not p.dra_socket.exists()
    assert not p.reg_socket.exists()
    with pytest.raises(KubeletError, match="no DRA plugin"):
        KubeletSimulator(p.registry_dir).wait_for_plugin(DRIVER, 0.2)


def test_registration_rejected_by_kubelet(plugin: Plugin) -> None:
    old_kubelet = KubeletSimulator(plugin.registry_dir, supported_services=("v1alpha4.DRAPlugin",))
    with pytest.raises(RegistrationRejected, match="none of services"):
        old_kubelet.wait_for_plugin(DRIVER, WAIT)
    registration = plugin.helper.server.registration
    assert registration.notified.wait(WAIT)
    assert not registration.registered.is_set()
    assert "none of services" in registration.last_error


def test_notify_false_returns_error_with_reason(plugin: Plugin) -> None:
    with grpc.insecure_channel(f"unix:{plugin.reg_socket}") as channel:
        stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
        status = pluginregistration_v1_pb2.RegistrationStatus(
            plugin_registered=False, error="driver name taken"
        )
        with pytest.raises(grpc.RpcError) as info:
            stub.NotifyRegistrationStatus(status, timeout=WAIT)
        assert "driver name taken" in (info.value.details() or "")  # type: ignore[attr-defined]
        assert plugin.helper.server.registration.last_error == "driver name taken"
        stub.NotifyRegistrationStatus(
            pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True), timeout=WAIT
        )
    assert plugin.helper.server.registration.registered.is_set()
    assert plugin.helper.server.registration.last_error == ""


@pytest.mark.parametrize(("verb", "version"), [("prepare", "v1"), ("unprepare", "v1beta1")])
def test_cli_prints_json(plugin: Plugin, verb: str, version: str) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "flexnpu_testing.kubelet",
            "--registry-dir",
            str(plugin.registry_dir),
            "--driver",
            DRIVER,
            "--api",
            version,
            verb,
            "--claim",
            f"{NAMESPACE}/claim-a/{plugin.a.uid}",
        ],
        env=pythonpath_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert doc["service"] == f"{version}.DRAPlugin"
    assert doc["claims"][plugin.a.uid]["error"] == ""
    if verb == "prepare":
        assert doc["claims"][plugin.a.uid]["devices"][0]["request_names"] == ["req"]
