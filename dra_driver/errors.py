"""One exception hierarchy for the whole driver, with stable codes.

Every error names the claim (UID) and the field it is about, when there is one::

    FlexNPUError(message, code=..., claim_uid=..., field=...)
    ├── InvalidInput    permanent: bad claim, opaque config, spec, message, inventory or file
    ├── Unavailable     retry later: API conflict or outage, daemon busy, socket down
    └── StateError      the checkpoint, registry or node disagrees with the request

Outside libraries' exceptions (grpc, kubernetes, pyroute2, OSError) are translated into
these at one boundary each, with ``raise ... from exc``.
"""

from __future__ import annotations

from enum import StrEnum

QUOTE_MAX = 200
"""At most this many characters of any input are quoted in an error (see :func:`quote`)."""
MESSAGE_MAX = 2000
FIELD_MAX = 256


def quote(value: object, limit: int = QUOTE_MAX) -> str:
    """``repr(value)``, cut to ``limit`` characters (with how much was left out), for error messages."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


class ErrorCode(StrEnum):
    """Stable machine-readable error codes (they appear in logs, events and claim conditions)."""

    INVALID_ARGUMENT = "InvalidArgument"
    CLAIM_NOT_ALLOCATED = "ClaimNotAllocated"
    CLAIM_REPLACED = "ClaimReplaced"
    CLAIM_NOT_FOUND = "ClaimNotFound"
    DEVICE_NOT_FOUND = "DeviceNotFound"
    DEVICE_BUSY = "DeviceBusy"
    INVALID_INVENTORY = "InvalidInventory"
    INVALID_NPU_SMI = "InvalidNpuSmiOutput"
    INVALID_CONFIG = "InvalidConfig"
    INVALID_OPAQUE_CONFIG = "InvalidOpaqueConfig"
    INVALID_PATH = "InvalidPath"
    INVALID_CDI = "InvalidCDISpec"
    CHECKPOINT_CORRUPT = "CheckpointCorrupt"
    API_UNAVAILABLE = "APIUnavailable"
    API_CONFLICT = "APIConflict"
    DAEMON_UNAVAILABLE = "DaemonUnavailable"
    QUOTA = "QuotaInvalid"
    POLICY_CONFLICT = "PolicyConflict"
    TEMPLATE_UNSUPPORTED = "TemplateUnsupported"
    VNPU_ID_IN_USE = "VnpuIdInUse"
    VNPU_FAILED = "VnpuOperationFailed"
    VNPU_MODE = "VnpuModeNotContainer"
    DIE_UNHEALTHY = "DieUnhealthy"
    WRITE_FAILED = "WriteFailed"  # a node-side file (checkpoint, CDI spec, client.conf) could not be written
    CHECKPOINT_UNTRUSTED = "CheckpointUntrusted"  # the checkpoint cannot be read: nothing is removed
    SHM_UNBOUNDED = "ShmUnbounded"  # a share's shm dir cannot be bounded here (flexnpu-daemon --shm-mount)
    INTERNAL = "Internal"


class FlexNPUError(Exception):
    """Base of every driver error. ``str(err)`` is a full, user-facing sentence."""

    default_code: ErrorCode = ErrorCode.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode | None = None,
        claim_uid: str | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message if len(message) <= MESSAGE_MAX else message[:MESSAGE_MAX] + "…"
        self.code = code or self.default_code
        self.claim_uid = claim_uid
        self.field = field if field is None or len(field) <= FIELD_MAX else field[:FIELD_MAX] + "…"
        super().__init__(self._render())

    def _render(self) -> str:
        parts = []
        if self.claim_uid:
            parts.append(f"claim {self.claim_uid}")
        if self.field:
            parts.append(f"field {self.field}")
        prefix = f"{', '.join(parts)}: " if parts else ""
        return f"{prefix}{self.message} [{self.code}]"

    def for_claim(self, claim_uid: str) -> FlexNPUError:
        """Attach a claim UID (if none yet) and return self, for re-raising at the claim boundary."""
        if not self.claim_uid:
            self.claim_uid = claim_uid
            self.args = (self._render(),)
        return self


class InvalidInput(FlexNPUError):
    """Permanent: the input (claim, config, file, message) is malformed; retrying will not help."""

    default_code = ErrorCode.INVALID_ARGUMENT


class Unavailable(FlexNPUError):
    """Transient: a dependency (API server, daemon, socket) is not reachable now; retry."""

    default_code = ErrorCode.API_UNAVAILABLE


class StateError(FlexNPUError):
    """The recorded state (checkpoint, registry) and the request or the world disagree."""

    default_code = ErrorCode.INTERNAL
