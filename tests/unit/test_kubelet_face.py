"""Pure conversions of the kubelet face: claim checks, result completion, protobuf encoding, status table."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest

from api_protos.gen import dra_health_v1_pb2, dra_health_v1alpha1_pb2
from dra_driver.claims import ClaimRef, ClaimResult, DeviceHealthReport, PreparedDevice
from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput, StateError, Unavailable
from kubeletplugin import claimbatch, dra_v1, dra_v1beta1, health, registration, statuses
from kubeletplugin.serialize import CallSerializer

A = ClaimRef(namespace="ns", uid="uid-a", name="a")
B = ClaimRef(namespace="ns", uid="uid-b", name="b")


def _device(names: tuple[str, ...] = ("gpu",), share_id: str | None = None) -> PreparedDevice:
    return PreparedDevice(
        request_names=names,
        pool="pool",
        device="die-0",
        cdi_device_ids=("flexnpu.io/vnpu=x",),
        share_id=share_id,
    )


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        pytest.param((), (), id="empty"),
        pytest.param(("req",), ("req",), id="plain"),
        pytest.param(("req/sub",), ("req",), id="subrequest"),
        pytest.param(("req/sub-a", "req/sub-b", "req"), ("req",), id="dedup"),
        pytest.param(("b/x", "a", "b"), ("b", "a"), id="order-kept"),
        pytest.param(("a/b/c",), ("a",), id="only-first-segment"),
    ],
)
def test_strip_subrequests(names: tuple[str, ...], expected: tuple[str, ...]) -> None:
    assert claimbatch.strip_subrequests(names) == expected


@pytest.mark.parametrize(
    ("ref", "field"),
    [
        pytest.param(ClaimRef("ns", "", "a"), "claim.uid", id="empty-uid"),
        pytest.param(ClaimRef("", "u", "a"), "claim.namespace", id="empty-namespace"),
        pytest.param(ClaimRef("ns", "u", ""), "claim.name", id="empty-name"),
    ],
)
def test_claim_error_names_the_field(ref: ClaimRef, field: str) -> None:
    error = claimbatch.claim_error(ref)
    assert f"field {field}" in error
    assert "InvalidArgument" in error


def test_claim_error_empty_for_valid_claim() -> None:
    assert claimbatch.claim_error(A) == ""


def test_check_claims_splits_and_dedups() -> None:
    bad = ClaimRef("ns", "uid-c", "")
    checked = claimbatch.check_claims([A, bad, B, A])
    assert checked.valid == (A, B)
    assert set(checked.errors) == {"uid-c"}
    assert checked.requested == ("uid-a", "uid-c", "uid-b")


@pytest.mark.parametrize(
    ("results", "expected_errors"),
    [
        pytest.param({"uid-a": ClaimResult(devices=(_device(),)), "uid-b": ClaimResult()}, {"uid-a": "", "uid-b": ""}, id="all-present"),
        pytest.param({"uid-a": ClaimResult(devices=(_device(),))}, {"uid-a": "", "uid-b": claimbatch.MISSING_PREPARE}, id="one-missing"),
        pytest.param({}, {"uid-a": claimbatch.MISSING_PREPARE, "uid-b": claimbatch.MISSING_PREPARE}, id="all-missing"),
        pytest.param({"uid-a": ClaimResult(), "uid-b": ClaimResult(), "uid-x": ClaimResult()}, {"uid-a": "", "uid-b": ""}, id="unknown-dropped"),
    ],
)  # fmt: skip
def test_complete_prepare(results: dict[str, ClaimResult], expected_errors: dict[str, str]) -> None:
    completed = claimbatch.complete_prepare(claimbatch.check_claims([A, B]), results)
    assert list(completed) == ["uid-a", "uid-b"]
    for uid, expected in expected_errors.items():
        if expected:
            assert expected in completed[uid].error
            assert f"claim {uid}" in completed[uid].error
        else:
            assert completed[uid].error == ""


def test_complete_unprepare_fills_missing_and_keeps_errors() -> None:
    completed = claimbatch.complete_unprepare(claimbatch.check_claims([A, B]), {"uid-a": "boom"})
    assert completed["uid-a"] == "boom"
    assert claimbatch.MISSING_UNPREPARE in completed["uid-b"]


def test_normalise_result_drops_devices_of_failed_claim_and_strips_names() -> None:
    failed = claimbatch.normalise_result(ClaimResult(devices=(_device(),), error="bad"))
    assert failed == ClaimResult(error="bad")
    ok = claimbatch.normalise_result(ClaimResult(devices=(_device(("r/s", "r")),)))
    assert ok.devices[0].request_names == ("r",)


class _RecordingPreparer:
    def __init__(self, lock_file: Path | None = None) -> None:
        self.seen: list[list[ClaimRef]] = []
        self.lock_file = lock_file
        self.lock_was_held: list[bool] = []

    def _probe_lock(self) -> None:
        if self.lock_file is None:
            return
        fd = os.open(self.lock_file, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.lock_was_held.append(True)
        else:
            self.lock_was_held.append(False)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        self._probe_lock()
        self.seen.append(list(claims))
        return {c.uid: ClaimResult(devices=(_device(("req/sub",)),)) for c in claims}

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        self._probe_lock()
        self.seen.append(list(claims))
        return {c.uid: "" for c in claims}


def test_batch_runner_passes_only_valid_claims(tmp_path: Path) -> None:
    preparer = _RecordingPreparer()
    runner = claimbatch.BatchRunner(preparer, serializer=CallSerializer())
    results = runner.prepare([A, ClaimRef("ns", "", "x")])
    assert preparer.seen == [[A]]
    assert results["uid-a"].devices[0].request_names == ("req",)
    assert "claim.uid" in results[""].error


def test_batch_runner_skips_preparer_when_nothing_valid() -> None:
    preparer = _RecordingPreparer()
    runner = claimbatch.BatchRunner(preparer, serializer=CallSerializer())
    assert "claim.name" in runner.unprepare([ClaimRef("ns", "u", "")])["u"]
    assert preparer.seen == []


def test_batch_runner_holds_the_file_lock_during_calls(tmp_path: Path) -> None:
    lock_file = tmp_path / "sub" / "serialize.lock"
    preparer = _RecordingPreparer(lock_file)
    runner = claimbatch.BatchRunner(preparer, serializer=CallSerializer(lock_file))
    runner.prepare([A])
    runner.unprepare([A])
    assert preparer.lock_was_held == [True, True]
    assert lock_file.stat().st_mode & 0o777 == 0o600
    # released afterwards
    fd = os.open(lock_file, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("share_id", "has_field"),
    [
        pytest.param(None, False, id="none-unset"),
        pytest.param("", True, id="empty-string-set"),
        pytest.param("share-1", True, id="value-set"),
    ],
)
def test_v1_share_id_presence(share_id: str | None, has_field: bool) -> None:
    msg = dra_v1.device_to_proto(_device(share_id=share_id))
    assert msg.HasField("share_id") is has_field
    if has_field:
        assert msg.share_id == share_id


def test_v1beta1_device_has_no_share_id() -> None:
    msg = dra_v1beta1.device_to_proto(_device(share_id="share-1"))
    assert "share_id" not in msg.DESCRIPTOR.fields_by_name
    assert (msg.pool_name, msg.device_name, list(msg.cdi_device_ids)) == (
        "pool",
        "die-0",
        ["flexnpu.io/vnpu=x"],
    )


@pytest.mark.parametrize("module", [pytest.param(dra_v1, id="v1"), pytest.param(dra_v1beta1, id="v1beta1")])
def test_prepare_response_one_entry_per_claim(module: object) -> None:
    results = {"uid-a": ClaimResult(devices=(_device(),)), "uid-b": ClaimResult(error="nope")}
    response = module.prepare_response(results)  # type: ignore[attr-defined]
    assert set(response.claims) == {"uid-a", "uid-b"}
    assert response.claims["uid-a"].error == ""
    assert list(response.claims["uid-a"].devices[0].request_names) == ["gpu"]
    assert response.claims["uid-b"].error == "nope"
    assert len(response.claims["uid-b"].devices) == 0
    unprep = module.unprepare_response({"uid-a": "", "uid-b": "x"})  # type: ignore[attr-defined]
    assert set(unprep.claims) == {"uid-a", "uid-b"}
    assert unprep.claims["uid-b"].error == "x"


def test_claims_from_proto() -> None:
    pb = dra_v1.pb
    refs = dra_v1.claims_from_proto([pb.Claim(namespace="ns", uid="u", name="n")])
    assert refs == [ClaimRef(namespace="ns", uid="u", name="n")]


@pytest.mark.parametrize(
    ("message", "expected_len", "cut"),
    [
        pytest.param("ok", 2, False, id="short"),
        pytest.param("x" * 1024, 1024, False, id="exactly-limit"),
        pytest.param("x" * 5000, 1024, True, id="long"),
    ],
)
def test_truncate_message(message: str, expected_len: int, cut: bool) -> None:
    out = health.truncate_message(message)
    assert len(out) == expected_len
    assert out.endswith("...") is cut


@pytest.mark.parametrize(
    "pb", [pytest.param(dra_health_v1alpha1_pb2, id="v1alpha1"), pytest.param(dra_health_v1_pb2, id="v1")]
)
def test_health_response(pb: object) -> None:
    reports = [
        DeviceHealthReport(pool="p", device="d0", healthy=True),
        DeviceHealthReport(pool="p", device="d1", healthy=False, message="x" * 2000),
        DeviceHealthReport(pool="p", device="d2", healthy=None),
    ]
    response = health.health_response(pb, reports, now=1234)
    got = [(d.device.pool_name, d.device.device_name, d.health) for d in response.devices]
    assert got == [("p", "d0", 1), ("p", "d1", 2), ("p", "d2", 0)]
    assert {d.health_check_timeout_seconds for d in response.devices} == {30}
    assert {d.last_updated_time for d in response.devices} == {1234}
    assert len(response.devices[1].message) == 1024


@pytest.mark.parametrize(
    "resend",
    [pytest.param(0.0, id="zero"), pytest.param(30.0, id="at-timeout"), pytest.param(45.0, id="above")],
)
def test_health_resend_must_be_below_timeout(resend: float) -> None:
    class _Source:
        def device_health(self) -> list[DeviceHealthReport]:
            return []

    with pytest.raises(InvalidInput, match="resend_seconds"):
        health.HealthBroadcaster(_Source(), resend_seconds=resend)


def test_status_table_covers_every_error_code() -> None:
    assert set(statuses.STATUS_BY_CODE) == set(ErrorCode)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        pytest.param(RuntimeError("boom"), grpc.StatusCode.INTERNAL, id="bug"),
        pytest.param(InvalidInput("bad", field="x"), grpc.StatusCode.INVALID_ARGUMENT, id="invalid"),
        pytest.param(Unavailable("later"), grpc.StatusCode.UNAVAILABLE, id="unavailable"),
        pytest.param(
            Unavailable("daemon", code=ErrorCode.DAEMON_UNAVAILABLE), grpc.StatusCode.UNAVAILABLE, id="daemon"
        ),
        pytest.param(
            StateError("corrupt", code=ErrorCode.CHECKPOINT_CORRUPT),
            grpc.StatusCode.DATA_LOSS,
            id="checkpoint",
        ),
        pytest.param(
            FlexNPUError("x", code=ErrorCode.CLAIM_NOT_FOUND), grpc.StatusCode.NOT_FOUND, id="not-found"
        ),
    ],
)
def test_status_for(exc: BaseException, code: grpc.StatusCode) -> None:
    got_code, detail = statuses.status_for(exc)
    assert got_code == code
    assert str(exc) in detail or type(exc).__name__ in detail


def test_registration_needs_absolute_endpoint() -> None:
    with pytest.raises(InvalidInput, match="dra_socket"):
        registration.RegistrationServicer(driver_name="d", endpoint=Path("relative/dra.sock"))


def test_registration_advertises_v1_first() -> None:
    assert registration.SUPPORTED_SERVICES == (
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    )
