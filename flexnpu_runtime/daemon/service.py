"""The daemon's gRPC face: ``flexnpu.daemon.v1.FlexNPUDaemon`` on a unix socket.

Thin: decode the request, call :class:`~flexnpu_runtime.daemon.manager.Manager`, encode the
answer, and map driver errors to gRPC status codes by the wire's one table (``dra_driver/daemon_api/wire.py``).
The status details are the error's full sentence (naming the claim and field); trailing
metadata carries the stable error code, claim UID, field and bare message so the client can
rebuild the same exception.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any, TypeVar

import grpc

from api_protos.gen import flexnpu_daemon_pb2 as pb
from api_protos.gen import flexnpu_daemon_pb2_grpc as pb_grpc
from dra_driver.daemon_api import wire
from dra_driver.errors import ErrorCode, FlexNPUError, Unavailable
from flexnpu_runtime.daemon.manager import VERSION, Manager

__all__ = ["STATUS_BY_ERROR", "VERSION", "DaemonServicer", "serve", "status_for"]

STATUS_BY_ERROR = wire.STATUS_BY_ERROR
"""Driver error class → gRPC status, the first matching row wins: the wire's one table (``wire.ERRORS``)."""

_Resp = TypeVar("_Resp")


def status_for(err: FlexNPUError) -> grpc.StatusCode:
    for cls, code in STATUS_BY_ERROR:
        if isinstance(err, cls):
            return code
    return grpc.StatusCode.INTERNAL


class DaemonServicer(pb_grpc.FlexNPUDaemonServicer):
    def __init__(self, manager: Manager) -> None:
        self.manager = manager

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterResponse:  # noqa: N802
        req = wire.register_request_from_pb(request)
        return _call(context, lambda: wire.register_result_to_pb(self.manager.register(req)))

    def Unregister(  # noqa: N802
        self, request: pb.UnregisterRequest, context: grpc.ServicerContext
    ) -> pb.UnregisterResponse:
        uid = str(request.claim_uid)
        return _call(context, lambda: pb.UnregisterResponse(found=self.manager.unregister(uid)))

    def List(self, request: pb.ListRequest, context: grpc.ServicerContext) -> pb.ListResponse:  # noqa: N802
        return _call(
            context,
            lambda: pb.ListResponse(
                entities=[wire.entity_to_pb(e) for e in self.manager.list(probe=bool(request.probe))]
            ),
        )

    def Health(self, request: pb.HealthRequest, context: grpc.ServicerContext) -> pb.HealthResponse:  # noqa: N802
        return wire.health_to_pb(self.manager.health(os.getpid()))


def _call(context: grpc.ServicerContext, fn: Callable[[], _Resp]) -> _Resp:
    try:
        return fn()
    except FlexNPUError as err:
        _abort(context, err)
    except OSError as exc:
        _abort(context, FlexNPUError(f"daemon I/O error: {exc}", code=ErrorCode.INTERNAL))
    raise AssertionError("unreachable")  # context.abort raises


def _abort(context: grpc.ServicerContext, err: FlexNPUError) -> None:
    md: list[tuple[str, Any]] = [(wire.MD_CODE, str(err.code)), (wire.MD_MESSAGE, err.message.encode())]
    if err.claim_uid:
        md.append((wire.MD_CLAIM, _ascii(err.claim_uid)))
    if err.field:
        md.append((wire.MD_FIELD, _ascii(err.field)))
    context.set_trailing_metadata(tuple(md))
    context.abort(status_for(err), str(err))


def _ascii(text: str) -> str:
    return text.encode("ascii", errors="replace").decode()


def serve(manager: Manager, socket_path: Path, *, workers: int = 8) -> grpc.Server:
    """Start serving on ``socket_path`` (mode 0600, parent 0700); refuse if a daemon answers there."""
    socket_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if socket_path.exists():
        if _answers(socket_path):
            raise Unavailable(
                f"another daemon is serving on {socket_path}",
                code=ErrorCode.DAEMON_UNAVAILABLE,
                field="socket",
            )
        socket_path.unlink()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="daemon-rpc"),
        options=[("grpc.so_reuseport", 0)],
    )
    pb_grpc.add_FlexNPUDaemonServicer_to_server(DaemonServicer(manager), server)  # type: ignore[no-untyped-call]
    old_umask = os.umask(0o177)
    try:
        server.add_insecure_port(f"unix://{socket_path}")
        server.start()
    finally:
        os.umask(old_umask)
    os.chmod(socket_path, 0o600)
    return server


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        with contextlib.suppress(OSError):
            s.connect(str(path))
            return True
    return False
