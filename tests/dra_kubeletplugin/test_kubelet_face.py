"""The helper's kubelet face without sockets: reference checks, fetching, results, codecs, health, statuses, sockets."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest

from dra_kubeletplugin import (
    claimbatch,
    dra_v1,
    dra_v1beta1,
    errors,
    health_stream,
    registration,
    sockets,
    statuses,
)
from dra_kubeletplugin.claims import ClaimRef, DeviceHealthReport, PreparedDevice, ResourceClaim
from dra_kubeletplugin.claims import PrepareResult as ClaimResult
from dra_kubeletplugin.errors import ClaimReason, ClaimRejected, InvalidArgument
from dra_kubeletplugin.fetch import FairFetcher
from dra_kubeletplugin.protos.gen import dra_health_v1_pb2, dra_health_v1alpha1_pb2
from dra_kubeletplugin.serialize import CallSerializer, TurnMissed

DRIVER = "gpu.example.com"
A = ClaimRef(namespace="ns", uid="uid-a", name="a")
B = ClaimRef(namespace="ns", uid="uid-b", name="b")


def _claim_obj(ref: ClaimRef) -> dict[str, object]:
    results = [{"request": "r", "driver": DRIVER, "pool": "p", "device": "d"}]
    return {"metadata": {"uid": ref.uid, "name": ref.name, "namespace": ref.namespace},
            "status": {"allocation": {"devices": {"results": results}}}}  # fmt: skip


def _fetcher(*refs: ClaimRef) -> FairFetcher:
    """A fetcher whose API is a dict of claims (the real one is tested against the fake API server)."""
    known = {r.name: _claim_obj(r) for r in refs}

    def get(namespace: str, name: str) -> dict[str, object]:
        if name not in known:
            err = errors.NotFound(f"resourceclaims {name!r} not found")
            err.set_details({"kind": "resourceclaims", "name": name, "group": "resource.k8s.io"})
            raise err
        return known[name]

    return FairFetcher(get, driver_name=DRIVER, workers=1)


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
def test_claim_problem_names_the_field(ref: ClaimRef, field: str) -> None:
    problem = claimbatch.claim_problem(ref)
    assert problem is not None and problem.reason == ClaimReason.MALFORMED
    assert problem.field == field and f"field {field}" in str(problem)


def test_claim_problem_none_for_valid_claim() -> None:
    assert claimbatch.claim_problem(A) is None


def test_check_claims_splits_and_dedups() -> None:
    bad = ClaimRef("ns", "uid-c", "")
    checked = claimbatch.check_claims([A, bad, B, A])
    assert checked.valid == (A, B)
    assert set(checked.rejected) == {"uid-c"}
    assert [r.uid for r in checked.requested] == ["uid-a", "uid-c", "uid-b"]


def test_normalise_result_drops_devices_of_failed_claim_and_strips_names() -> None:
    failed = claimbatch.normalise_result(ClaimResult(devices=(_device(),), error="bad"))
    assert failed == ClaimResult(error="bad")
    ok = claimbatch.normalise_result(ClaimResult(devices=(_device(("r/s", "r")),)))
    assert ok.devices[0].request_names == ("r",)


class _RecordingDriver:
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

    omit: frozenset[str] = frozenset()

    def prepare_resource_claims(self, claims: Sequence[ResourceClaim]) -> dict[str, ClaimResult]:
        self._probe_lock()
        self.seen.append([c.ref for c in claims])
        return {
            c.uid: ClaimResult(devices=(_device(("req/sub",)),)) for c in claims if c.uid not in self.omit
        }

    def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        self._probe_lock()
        self.seen.append(list(claims))
        return {c.uid: "" for c in claims}


def test_batch_runner_hands_the_driver_only_fetched_valid_claims() -> None:
    driver = _RecordingDriver()
    runner = claimbatch.BatchRunner(driver, fetcher=_fetcher(A), serializer=CallSerializer())
    results = runner.prepare([A, ClaimRef("ns", "", "x"), B])
    assert driver.seen == [[A]]
    assert results["uid-a"].devices[0].request_names == ("req",)
    assert "claim.uid" in results[""].error
    assert "not found" in results["uid-b"].error  # no claim b in the API: the driver never saw it
    assert list(results) == ["uid-a", "", "uid-b"]


def test_batch_runner_skips_the_driver_when_nothing_valid() -> None:
    driver = _RecordingDriver()
    runner = claimbatch.BatchRunner(driver, fetcher=_fetcher(), serializer=CallSerializer())
    assert "claim.name" in runner.unprepare([ClaimRef("ns", "u", "")])["u"]
    assert "not found" in runner.prepare([A])["uid-a"].error
    assert driver.seen == []


def test_missing_results_are_filled_and_unknown_ones_dropped() -> None:
    driver = _RecordingDriver()
    driver.omit = frozenset({"uid-b"})
    runner = claimbatch.BatchRunner(driver, fetcher=_fetcher(A, B), serializer=CallSerializer())
    results = runner.prepare([A, B])
    assert results["uid-a"].error == "" and claimbatch.MISSING_PREPARE in results["uid-b"].error


def test_the_drivers_claim_error_hook_gives_the_text() -> None:
    class Hooked(_RecordingDriver):
        def claim_error(self, verb: str, ref: ClaimRef, exc: Exception) -> str:
            return f"{verb}:{ref.uid}:{type(exc).__name__}"

    runner = claimbatch.BatchRunner(Hooked(), fetcher=_fetcher(), serializer=CallSerializer())
    assert runner.prepare([A])["uid-a"].error == "prepare:uid-a:NotFound"
    assert runner.unprepare([ClaimRef("ns", "u", "")])["u"] == "unprepare:u:ClaimRejected"


def test_a_missed_turn_answers_every_claim_of_the_call_without_the_driver() -> None:
    driver = _RecordingDriver()
    serializer = CallSerializer()
    runner = claimbatch.BatchRunner(driver, fetcher=_fetcher(A), serializer=serializer)
    with serializer.hold(None):  # another call holds the serializer past this call's deadline
        results = runner.prepare([A], deadline=time.monotonic() + 0.05)
        unprepared = runner.unprepare([A], deadline=time.monotonic() + 0.05)
    assert "not started" in results["uid-a"].error and "not started" in unprepared["uid-a"]
    assert driver.seen == []


def test_the_serializer_turn_is_bounded_by_the_deadline(tmp_path: Path) -> None:
    lock_file = tmp_path / "serialize.lock"
    other = CallSerializer(lock_file)  # another plugin instance of a rolling update
    mine = CallSerializer(lock_file)
    with other.hold(None), pytest.raises(TurnMissed):
        with mine.hold(time.monotonic() + 0.05):
            pass
    with mine.hold(time.monotonic() + 5):  # free again
        pass


def test_batch_runner_holds_the_file_lock_during_calls(tmp_path: Path) -> None:
    lock_file = tmp_path / "sub" / "serialize.lock"
    driver = _RecordingDriver(lock_file)
    runner = claimbatch.BatchRunner(driver, fetcher=_fetcher(A), serializer=CallSerializer(lock_file))
    runner.prepare([A])
    runner.unprepare([A])
    assert driver.lock_was_held == [True, True]
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
    out = health_stream.truncate_message(message)
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
    response = health_stream.health_response(pb, reports, now=1234)
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

    with pytest.raises(InvalidArgument, match="resend interval"):
        health_stream.HealthBroadcaster(_Source(), resend_seconds=resend)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        pytest.param(RuntimeError("boom"), grpc.StatusCode.INTERNAL, id="bug"),
        pytest.param(InvalidArgument("bad"), grpc.StatusCode.INVALID_ARGUMENT, id="invalid"),
        pytest.param(errors.ApiUnavailable("later"), grpc.StatusCode.UNAVAILABLE, id="unavailable"),
        pytest.param(errors.Unreachable("gone"), grpc.StatusCode.UNAVAILABLE, id="unreachable"),
        pytest.param(errors.Conflict("409"), grpc.StatusCode.ABORTED, id="conflict"),
        pytest.param(errors.NotFound("404"), grpc.StatusCode.NOT_FOUND, id="not-found"),
        pytest.param(errors.Rejected("422"), grpc.StatusCode.INVALID_ARGUMENT, id="rejected"),
        pytest.param(TurnMissed("busy"), grpc.StatusCode.UNAVAILABLE, id="turn-missed"),
        pytest.param(
            ClaimRejected.make("x", reason=ClaimReason.REPLACED, claim_uid="u"),
            grpc.StatusCode.FAILED_PRECONDITION,
            id="claim-rejected",
        ),
    ],
)
def test_status_for(exc: BaseException, code: grpc.StatusCode) -> None:
    got_code, detail = statuses.status_for(exc)
    assert got_code == code
    assert str(exc) in detail or type(exc).__name__ in detail


@pytest.mark.parametrize(
    ("exc", "retry"),
    [
        pytest.param(errors.Conflict("x"), True, id="conflict"),
        pytest.param(errors.Gone("x"), True, id="gone"),
        pytest.param(errors.NotFound("x"), False, id="not-found"),
        pytest.param(
            ClaimRejected.make("x", reason=ClaimReason.DEADLINE, claim_uid="u"), True, id="deadline"
        ),
        pytest.param(
            ClaimRejected.make("x", reason=ClaimReason.NOT_FOUND, claim_uid="u"), False, id="gone-claim"
        ),
        pytest.param(RuntimeError("x"), False, id="bug"),
    ],
)
def test_retryable(exc: Exception, retry: bool) -> None:
    assert errors.retryable(exc) is retry


def test_registration_needs_absolute_endpoint() -> None:
    with pytest.raises(InvalidArgument, match="absolute"):
        registration.RegistrationServicer(driver_name="d", endpoint=Path("relative/dra.sock"))


def test_registration_advertises_v1_first() -> None:
    assert registration.SUPPORTED_SERVICES == (
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    )


LONG_DRIVER = "d" * 40 + ".example.com"


@pytest.mark.parametrize(
    ("driver", "pod_uid", "registry", "expected"),
    [
        pytest.param(DRIVER, None, "/var/lib/kubelet/plugins_registry", "gpu.example.com-reg.sock", id="no-rolling-update"),
        pytest.param(DRIVER, "1234-abcd", "/var/lib/kubelet/plugins_registry", "gpu.example.com-1234-abcd-reg.sock", id="pod-uid"),
        pytest.param(DRIVER, "u" * 36, "/" + "r" * 40, "gpu.example.com-", id="hashed-uid"),
        pytest.param(LONG_DRIVER, "u" * 36, "/" + "r" * 70, "dra-", id="hashed-both"),
    ],
)  # fmt: skip
def test_registration_socket_names(driver: str, pod_uid: str | None, registry: str, expected: str) -> None:
    paths = sockets.plugin_sockets(driver, pod_uid=pod_uid, registry_dir=Path(registry))
    assert paths.registration.parent == Path(registry)
    assert paths.registration.name.startswith(expected) and paths.registration.name.endswith("-reg.sock")
    assert len(os.fsencode(paths.registration)) <= sockets.MAX_SOCKET_PATH_BYTES
    assert paths.dra.name == (f"dra-{pod_uid}.sock" if pod_uid else "dra.sock")
    assert paths.dra.parent == paths.serialize_lock.parent == sockets.KUBELET_PLUGINS_DIR / driver


def test_two_instances_of_a_rolling_update_get_distinct_sockets() -> None:
    one = sockets.plugin_sockets(DRIVER, pod_uid="a" * 36, registry_dir=Path("/" + "r" * 60))
    two = sockets.plugin_sockets(DRIVER, pod_uid="b" * 36, registry_dir=Path("/" + "r" * 60))
    assert one.registration != two.registration and one.dra != two.dra
    assert one.serialize_lock == two.serialize_lock  # they serialise on one file
