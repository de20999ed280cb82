"""The driver's one table from its error codes to gRPC status codes, handed to the helper as ``error_status``.

A whole-call failure (the driver raised) becomes a gRPC error; per-claim failures never do, they
travel in the claim's ``error`` field. A ``FlexNPUError`` maps by its code; anything else is a bug
(``INTERNAL``). The helper's own errors never reach this table: the helper maps them by its own
(``dra_kubeletplugin.statuses.mapped``).
"""

from __future__ import annotations

import grpc

from dra_driver.errors import ErrorCode, FlexNPUError
from dra_kubeletplugin import statuses as helper_statuses

STATUS_BY_CODE: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.CLAIM_NOT_ALLOCATED: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.CLAIM_REPLACED: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.CLAIM_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.DEVICE_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.DEVICE_BUSY: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.INVALID_INVENTORY: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.INVALID_NPU_SMI: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.INVALID_CONFIG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_OPAQUE_CONFIG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_PATH: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_CDI: grpc.StatusCode.INTERNAL,
    ErrorCode.CHECKPOINT_CORRUPT: grpc.StatusCode.DATA_LOSS,
    ErrorCode.API_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.API_CONFLICT: grpc.StatusCode.ABORTED,
    ErrorCode.DAEMON_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.QUOTA: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.POLICY_CONFLICT: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.TEMPLATE_UNSUPPORTED: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.VNPU_ID_IN_USE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.VNPU_FAILED: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.VNPU_MODE: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.DIE_UNHEALTHY: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.WRITE_FAILED: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.CHECKPOINT_UNTRUSTED: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.SHM_UNBOUNDED: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.CGROUP_FAILED: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
}


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status code and detail text for an exception that failed a whole call."""
    if isinstance(exc, FlexNPUError):
        return STATUS_BY_CODE[exc.code], str(exc)
    return helper_statuses.internal(exc)
