"""The plugin's gRPC face over real unix sockets, driven by the kubelet simulator.

The preparer and health source are small in-test fakes standing in for the domain; everything
between them and the simulator (sockets, gRPC servers, registration, streams) is real.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from api_protos.gen import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc
from dra_driver.claims import ClaimRef, ClaimResult, DeviceHealthReport, PreparedDevice
from dra_driver.errors import ErrorCode, Unavailable
from flexnpu_testing import pythonpath_env
from flexnpu_testing.kubelet import KubeletError, KubeletSimulator, RegistrationRejected
from kubeletplugin.server import PluginServer

DRIVER = "npu.flexnpu.io"
A = ClaimRef(namespace="ns", uid="uid-a", name="claim-a")
B = ClaimRef(namespace="ns", uid="uid-b", name="claim-b")
WAIT = 10.0


class FakePreparer:
    """Prepares every claim to one device; ``fail_next`` makes the next call raise."""

    def __init__(self) -> None:
        self.prepared: dict[str, ClaimRef] = {}
        self.fail_next: BaseException | None = None
        self.omit: set[str] = set()

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        self._maybe_fail()
        out: dict[str, ClaimResult] = {}
        for c in claims:
            if c.uid in self.omit:
                continue
            self.prepared[c.uid] = c
            device = PreparedDevice(
                request_names=("npu/share-0", "npu/share-1", "npu"),
                pool="node-a",
                device=f"die-{c.name}",
                cdi_device_ids=(f"flexnpu.io/vnpu={c.uid}",),
                share_id=f"share-{c.uid}",
            )
            out[c.uid] = ClaimResult(devices=(device,))
        return out

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
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
            DeviceHealthReport(pool="node-a", device="die-0", healthy=True),
            DeviceHealthReport(pool="node-a", device="die-1", healthy=True),
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
    server: PluginServer
    preparer: FakePreparer
    health: FakeHealth
    registry_dir: Path
    dra_socket: Path
    reg_socket: Path


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # pytest's tmp_path can exceed the 108-byte unix socket limit
    d = Path(tempfile.mkdtemp(prefix="fx", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _make_plugin(sock_dir: Path, *, resend_seconds: float = 10.0, with_health: bool = True) -> Plugin:
    registry = sock_dir / "plugins_registry"
    dra = sock_dir / "plugins" / DRIVER / "dra.sock"
    reg = registry / f"{DRIVER}-reg.sock"
    preparer, source = FakePreparer(), FakeHealth()
    server = PluginServer(
        driver_name=DRIVER,
        dra_socket=dra,
        registration_socket=reg,
        preparer=preparer,
        health_source=source if with_health else None,
        serialize_lock_file=sock_dir / "plugins" / DRIVER / "serialize.lock",
        resend_seconds=resend_seconds,
    )
    return Plugin(server, preparer, source, registry, dra, reg)


@pytest.fixture
def plugin(sock_dir: Path) -> Iterator[Plugin]:
    p = _make_plugin(sock_dir)
    p.server.start()
    try:
        yield p
    finally:
        p.server.stop(grace=1)


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
        assert plugin.server.registration.registered.wait(WAIT)
        assert plugin.server.registration.last_error == ""

        results = handle.prepare([A, B])
        assert set(results) == {"uid-a", "uid-b"}
        for ref in (A, B):
            (device,) = results[ref.uid].devices
            assert results[ref.uid].error == ""
            assert device.request_names == ("npu",)
            assert (device.pool, device.device) == ("node-a", f"die-{ref.name}")
            assert device.cdi_device_ids == (f"flexnpu.io/vnpu={ref.uid}",)
            assert device.share_id == (f"share-{ref.uid}" if has_share_id else None)
        assert set(plugin.preparer.prepared) == {"uid-a", "uid-b"}

        assert handle.unprepare([A, B]) == {"uid-a": "", "uid-b": ""}
        assert plugin.preparer.prepared == {}


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        pytest.param(ClaimRef(namespace="ns", uid="", name="claim-x"), "claim.uid", id="empty-uid"),
        pytest.param(
            ClaimRef(namespace="", uid="uid-x", name="claim-x"), "claim.namespace", id="empty-namespace"
        ),
        pytest.param(ClaimRef(namespace="ns", uid="uid-x", name=""), "claim.name", id="empty-name"),
    ],
)
def test_malformed_claim_gets_its_own_error(plugin: Plugin, bad: ClaimRef, field: str) -> None:
    with KubeletSimulator(plugin.registry_dir).wait_for_plugin(DRIVER, WAIT) as handle:
        results = handle.prepare([bad, A])
        assert field in results[bad.uid].error
        assert results[bad.uid].devices == ()
        assert results["uid-a"].error == ""
        assert len(results["uid-a"].devices) == 1
        unprepared = handle.unprepare([bad, A])
        assert field in unprepared[bad.uid]
        assert unprepared["uid-a"] == ""
    assert bad.uid not in plugin.preparer.prepared


def test_missing_result_from_preparer_is_filled(plugin: Plugin) -> None:
    plugin.preparer.omit = {"uid-b"}
    with KubeletSimulator(plugin.registry_dir).wait_for_plugin(DRIVER, WAIT) as handle:
        results = handle.prepare([A, B])
        assert results["uid-a"].error == ""
        assert "no prepare result" in results["uid-b"].error
        unprepared = handle.unprepare([A, B])
        assert unprepared["uid-a"] == ""
        assert "no unprepare result" in unprepared["uid-b"]


@pytest.mark.parametrize(
    ("exc", "code", "text"),
    [
        pytest.param(
            RuntimeError("boom in the domain"), grpc.StatusCode.INTERNAL, "boom in the domain", id="bug"
        ),
        pytest.param(
            Unavailable("daemon down", code=ErrorCode.DAEMON_UNAVAILABLE),
            grpc.StatusCode.UNAVAILABLE,
            "daemon down",
            id="unavailable",
        ),
    ],
)
@pytest.mark.parametrize("verb", ["prepare", "unprepare"])
def test_preparer_exception_maps_to_status_and_server_survives(
    plugin: Plugin, exc: BaseException, code: grpc.StatusCode, text: str, verb: str
) -> None:
    with KubeletSimulator(plugin.registry_dir).wait_for_plugin(DRIVER, WAIT) as handle:
        call = getattr(handle, verb)
        plugin.preparer.fail_next = exc
        with pytest.raises(KubeletError) as info:
            call([A])
        assert info.value.code == code
        assert text in str(info.value)
        results = call([A])
        assert set(results) == {"uid-a"}


@pytest.mark.parametrize("service", ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth", None])
def test_health_stream_sends_set_then_updates(plugin: Plugin, service: str | None) -> None:
    with KubeletSimulator(plugin.registry_dir).wait_for_plugin(DRIVER, WAIT) as handle:
        watch = handle.watch_health(service)
        try:
            assert watch.service == (service or "v1.DRAResourceHealth")
            first = watch.next(WAIT)
            assert [(d.device, d.healthy) for d in first.devices] == [("die-0", True), ("die-1", True)]
            assert {d.health_check_timeout_seconds for d in first.raw.devices} == {30}
            assert all(d.last_updated_time > 0 for d in first.raw.devices)

            plugin.health.set(
                [
                    DeviceHealthReport(pool="node-a", device="die-0", healthy=True),
                    DeviceHealthReport(pool="node-a", device="die-1", healthy=False, message="x" * 3000),
                ]
            )
            plugin.server.notify_health_changed()
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
            plugin.server.notify_health_changed()
            assert watch.ended.wait(WAIT)
            assert watch.end_code == grpc.StatusCode.INTERNAL
            assert "sensor read failed" in watch.end_details
        finally:
            watch.close()
        plugin.health.fail = None
        assert handle.prepare([A])["uid-a"].error == ""  # the server is still serving
        again = handle.watch_health()
        try:
            assert len(again.next(WAIT).devices) == 2
        finally:
            again.close()


def test_health_stream_resends_periodically(sock_dir: Path) -> None:
    p = _make_plugin(sock_dir, resend_seconds=0.2)
    p.server.start()
    try:
        with KubeletSimulator(p.registry_dir).wait_for_plugin(DRIVER, WAIT) as handle:
            watch = handle.watch_health()
            try:
                updates = [watch.next(WAIT) for _ in range(3)]  # no notify_changed: resends only
            finally:
                watch.close()
        assert all(len(u.devices) == 2 for u in updates)
    finally:
        p.server.stop(grace=1)


def test_health_stream_ends_cleanly_on_stop(sock_dir: Path) -> None:
    p = _make_plugin(sock_dir)
    p.server.start()
    try:
        handle = KubeletSimulator(p.registry_dir).wait_for_plugin(DRIVER, WAIT)
        watch = handle.watch_health("v1alpha1.DRAResourceHealth")
        watch.next(WAIT)
    finally:
        p.server.stop(grace=1)
    try:
        assert watch.ended.wait(WAIT)
        assert watch.end_code == grpc.StatusCode.OK
    finally:
        watch.close()
        handle.close()


def test_no_health_source_advertises_no_health(sock_dir: Path) -> None:
    p = _make_plugin(sock_dir, with_health=False)
    p.server.start()
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
        p.server.stop(grace=1)


def test_sockets_removed_after_stop_and_stale_ones_replaced(sock_dir: Path) -> None:
    p = _make_plugin(sock_dir)
    for path in (p.dra_socket, p.reg_socket):  # leftovers of a crashed instance
        path.parent.mkdir(parents=True, exist_ok=True)
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(str(path))
        stale.close()
    p.server.start()
    try:
        with KubeletSimulator(p.registry_dir).wait_for_plugin(DRIVER, WAIT) as handle:
            assert handle.prepare([A])["uid-a"].error == ""
    finally:
        p.server.stop(grace=1)
    assert not p.dra_socket.exists()
    assert not p.reg_socket.exists()
    with pytest.raises(KubeletError, match="no DRA plugin"):
        KubeletSimulator(p.registry_dir).wait_for_plugin(DRIVER, 0.2)


def test_registration_rejected_by_kubelet(plugin: Plugin) -> None:
    old_kubelet = KubeletSimulator(plugin.registry_dir, supported_services=("v1alpha4.DRAPlugin",))
    with pytest.raises(RegistrationRejected, match="none of services"):
        old_kubelet.wait_for_plugin(DRIVER, WAIT)
    registration = plugin.server.registration
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
        assert plugin.server.registration.last_error == "driver name taken"
        stub.NotifyRegistrationStatus(
            pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True), timeout=WAIT
        )
    assert plugin.server.registration.registered.is_set()
    assert plugin.server.registration.last_error == ""


@pytest.mark.parametrize(("verb", "api"), [("prepare", "v1"), ("unprepare", "v1beta1")])
def test_cli_prints_json(plugin: Plugin, verb: str, api: str) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "flexnpu_testing.kubelet",
            "--registry-dir",
            str(plugin.registry_dir),
            "--api",
            api,
            verb,
            "--claim",
            "ns/claim-a/uid-a",
        ],
        env=pythonpath_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert doc["service"] == f"{api}.DRAPlugin"
    assert doc["claims"]["uid-a"]["error"] == ""
    if verb == "prepare":
        assert doc["claims"]["uid-a"]["devices"][0]["request_names"] == ["npu"]
