"""Client of the FlexNPU daemon API, for the kubelet plugin and ``flexnpu-smi``.

Usage::

    with DaemonClient("/var/run/flexnpu/daemon.sock", timeout=10.0) as daemon:
        result = daemon.register(RegisterRequest(claim_uid=..., token=..., shares=(...)))
        daemon.unregister(claim_uid)

Returns :mod:`dra_driver.daemon_api.values` dataclasses and raises only :mod:`dra_driver.errors`:
an unreachable daemon (or a deadline) → :class:`Unavailable` with code ``DaemonUnavailable``;
``INVALID_ARGUMENT`` → :class:`InvalidInput`; ``FAILED_PRECONDITION`` → :class:`StateError`;
anything else → :class:`FlexNPUError`. The daemon's error code, claim and field are kept.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import grpc

from api_protos.gen import flexnpu_daemon_pb2 as pb
from api_protos.gen import flexnpu_daemon_pb2_grpc as pb_grpc
from dra_driver.daemon_api import wire
from dra_driver.daemon_api.values import EntityInfo, HealthInfo, RegisterRequest, RegisterResult
from dra_driver.errors import ErrorCode, FlexNPUError, Unavailable

__all__ = ["DEFAULT_SOCKET", "DaemonClient", "error_from_rpc"]

DEFAULT_SOCKET = "/var/run/flexnpu/daemon.sock"

ERROR_BY_STATUS = wire.ERROR_BY_STATUS
"""gRPC status → driver error class (and the code used when the daemon sent none): ``wire.ERRORS``."""

_T = TypeVar("_T")


class DaemonClient:
    """A connection to the daemon's unix socket. Thread-safe; cheap to keep for the process lifetime.

    **Parameters:**
    * socket_path - the daemon's unix socket.
    * timeout - deadline in seconds for each call (Register waits for the aclserver to be ready).
    """

    def __init__(self, socket_path: str | Path = DEFAULT_SOCKET, timeout: float = 30.0) -> None:
        self.socket_path = str(socket_path)
        self.timeout = timeout
        self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
        self._stub = pb_grpc.FlexNPUDaemonStub(self._channel)  # type: ignore[no-untyped-call]

    def register(self, request: RegisterRequest) -> RegisterResult:
        msg = wire.register_request_to_pb(request)
        return wire.register_result_from_pb(self._call(self._stub.Register, msg, request.claim_uid))

    def unregister(self, claim_uid: str) -> bool:
        """Stop the claim's aclserver; False if the daemon did not know the claim (still success)."""
        resp = self._call(self._stub.Unregister, pb.UnregisterRequest(claim_uid=claim_uid), claim_uid)
        return bool(resp.found)

    def list(self, *, probe: bool = False) -> list[EntityInfo]:
        """Every registered claim; with ``probe`` each running aclserver is also PINGed."""
        resp = self._call(self._stub.List, pb.ListRequest(probe=probe), None)
        return [wire.entity_from_pb(e) for e in resp.entities]

    def health(self) -> HealthInfo:
        return wire.health_from_pb(self._call(self._stub.Health, pb.HealthRequest(), None))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> DaemonClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, method: Callable[..., _T], msg: object, claim_uid: str | None) -> _T:
        try:
            return method(msg, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, socket_path=self.socket_path, claim_uid=claim_uid) from exc


def error_from_rpc(exc: grpc.RpcError, *, socket_path: str, claim_uid: str | None) -> FlexNPUError:
    """Translate a failed call into the matching :mod:`dra_driver.errors` exception."""
    status = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
    md: dict[str, str | bytes] = {}
    if isinstance(exc, grpc.Call):
        md = {k: v for k, v in (exc.trailing_metadata() or ())}
    cls, default_code = ERROR_BY_STATUS.get(status, (FlexNPUError, ErrorCode.INTERNAL))
    raw_message = md.get(wire.MD_MESSAGE)
    if wire.MD_CODE not in md:  # not from the daemon's error table: transport or framework failure
        if cls is Unavailable:
            return Unavailable(
                f"cannot reach flexnpu-daemon at {socket_path} ({status.name}: {details})",
                code=ErrorCode.DAEMON_UNAVAILABLE,
                claim_uid=claim_uid,
                field="socket",
            )
        return cls(f"daemon call failed ({status.name}): {details}", code=default_code, claim_uid=claim_uid)
    try:
        code = ErrorCode(str(md[wire.MD_CODE]))
    except ValueError:
        code = default_code
    message = raw_message.decode(errors="replace") if isinstance(raw_message, bytes) else details
    return cls(
        message,
        code=code,
        claim_uid=str(md.get(wire.MD_CLAIM) or claim_uid or "") or None,
        field=str(md[wire.MD_FIELD]) if wire.MD_FIELD in md else None,
    )
