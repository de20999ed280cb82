"""The driver's tables at the kubelet face: error code -> gRPC status, and what the helper hit -> driver error."""

from __future__ import annotations

import grpc
import pytest

from controller import kube
from dra_driver.claims import claim_error
from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput, StateError, Unavailable
from dra_kubeletplugin import errors, statuses
from dra_kubeletplugin.claims import ClaimRef
from dra_kubeletplugin.errors import ClaimReason, ClaimRejected
from kubeletplugin import error_status

REF = ClaimRef(namespace="ns", uid="0b7d7a5c-1111-2222-3333-000000000001", name="a")


def test_status_table_covers_every_error_code() -> None:
    assert set(error_status.STATUS_BY_CODE) == set(ErrorCode)


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
        pytest.param(kube.Conflict("409"), grpc.StatusCode.ABORTED, id="api-conflict-by-code"),
        pytest.param(errors.Unreachable("x"), grpc.StatusCode.UNAVAILABLE, id="helper-error"),
    ],
)
def test_status_for(exc: BaseException, code: grpc.StatusCode) -> None:
    """As the helper maps a failed call: its own errors by its table, the rest by the driver's."""
    got_code, detail = statuses.mapped(exc, error_status.status_for)
    assert got_code == code
    assert str(exc) in detail or type(exc).__name__ in detail


@pytest.mark.parametrize(
    ("reason", "code"),
    [pytest.param(r, c, id=str(r)) for r, c in [
        (ClaimReason.MALFORMED, ErrorCode.INVALID_PATH),
        (ClaimReason.NOT_FOUND, ErrorCode.CLAIM_NOT_FOUND),
        (ClaimReason.REPLACED, ErrorCode.CLAIM_REPLACED),
        (ClaimReason.NOT_ALLOCATED, ErrorCode.CLAIM_NOT_ALLOCATED),
        (ClaimReason.NOT_THIS_DRIVER, ErrorCode.CLAIM_NOT_ALLOCATED),
        (ClaimReason.UNAVAILABLE, ErrorCode.API_UNAVAILABLE),
        (ClaimReason.DEADLINE, ErrorCode.API_UNAVAILABLE),
    ]],
)  # fmt: skip
def test_every_helper_reason_becomes_a_driver_error_naming_claim_and_field(
    reason: ClaimReason, code: ErrorCode
) -> None:
    err = claim_error(
        ClaimRejected.make("what happened", reason=reason, claim_uid=REF.uid, field="f.x"), REF.uid
    )
    assert err.code == code and err.claim_uid == REF.uid and err.field == "f.x"
    assert str(err) == f"claim {REF.uid}, field f.x: what happened [{code}]"


def test_the_api_clients_errors_are_kept_and_an_unknown_one_is_internal() -> None:
    proven = kube.ClaimNotFound("resourceclaims 'a' not found")
    assert claim_error(proven, REF.uid) is proven and proven.code == ErrorCode.CLAIM_NOT_FOUND
    assert REF.uid in str(proven)
    assert claim_error(RuntimeError("x"), REF.uid).code == ErrorCode.INTERNAL
