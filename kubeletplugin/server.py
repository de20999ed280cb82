"""The two gRPC servers of the kubelet plugin: DRA (+ health) on dra.sock, registration on the reg socket.

Start order matters: the kubelet uses the DRA socket right after registering, so the DRA
server is serving before the registration socket appears. Stop order is the reverse:
removing the registration socket deregisters the plugin, then the DRA server drains.
This module owns the socket files (stale ones are removed at start, ours at stop) and the
thread pools; it does not know what preparing a claim means.
"""

from __future__ import annotations

import logging
import os
import stat
from concurrent import futures
from pathlib import Path
from types import TracebackType

import grpc

from api_protos.gen import (
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2_grpc,
)
from dra_driver.claims import ClaimPreparer, HealthSource
from dra_driver.errors import ErrorCode, InvalidInput, StateError
from kubeletplugin import health, registration
from kubeletplugin.claimbatch import BatchRunner
from kubeletplugin.dra_v1 import DRAPluginV1Servicer
from kubeletplugin.dra_v1beta1 import DRAPluginV1Beta1Servicer
from kubeletplugin.serialize import CallSerializer

MAX_SOCKET_PATH_BYTES = 107  # sun_path is 108 bytes including the terminating NUL
SOCKET_MODE = 0o600
DIR_MODE = 0o750
DEFAULT_WORKERS = 4

_log = logging.getLogger("flexnpu.kubeletplugin.server")


class PluginServer:
    """Serves one DRA driver to the kubelet over two unix sockets.

    Usage::

        server = PluginServer(driver_name="npu.flexnpu.io", dra_socket=..., registration_socket=...,
                              preparer=preparer, health_source=health_source)
        server.start()
        ...
        server.notify_health_changed()
        server.stop()

    **Parameters:**

    * ``driver_name`` — the DRA driver name.
    * ``dra_socket`` — absolute path of the DRA service socket (v1, v1beta1, health).
    * ``registration_socket`` — absolute path in the kubelet plugin registry directory.
    * ``preparer`` — the domain object that prepares claims.
    * ``health_source`` — device health; ``None`` serves and advertises no health service.
    * ``serialize_lock_file`` — also ``flock`` this file around each call (rolling updates).
    * ``resend_seconds`` — longest gap between two health responses.
    * ``max_workers`` — DRA server threads (an open health stream holds one).
    """

    def __init__(
        self,
        *,
        driver_name: str,
        dra_socket: Path,
        registration_socket: Path,
        preparer: ClaimPreparer,
        health_source: HealthSource | None,
        serialize_lock_file: Path | None = None,
        resend_seconds: float = health.DEFAULT_RESEND_SECONDS,
        max_workers: int = DEFAULT_WORKERS,
    ) -> None:
        for field, path in (("dra_socket", dra_socket), ("registration_socket", registration_socket)):
            _check_socket_path(field, path)
        self.driver_name = driver_name
        self.dra_socket = dra_socket
        self.registration_socket = registration_socket
        self.runner = BatchRunner(preparer, serializer=CallSerializer(serialize_lock_file))
        self.health = (
            health.HealthBroadcaster(health_source, resend_seconds=resend_seconds) if health_source else None
        )
        services = registration.DRA_SERVICES + (registration.HEALTH_SERVICES if self.health else ())
        self.registration = registration.RegistrationServicer(
            driver_name=driver_name, endpoint=dra_socket, supported_versions=services
        )
        self._max_workers = max_workers
        self._dra_server: grpc.Server | None = None
        self._reg_server: grpc.Server | None = None
        self._used = False

    def notify_health_changed(self) -> None:
        """Tell open health streams to resend now (no-op without a health source)."""
        if self.health:
            self.health.notify_changed()

    def start(self) -> None:
        """Serve DRA (and health) on ``dra_socket``, then registration on ``registration_socket``."""
        if self._used:
            raise StateError("a PluginServer can be started only once; create a new one", field="start")
        self._used = True
        try:
            self._dra_server = self._serve_dra()
            self._reg_server = self._serve_registration()
        except BaseException:
            self.stop(grace=0)
            raise
        _log.info(
            "serving DRA driver %s on %s, registration on %s",
            self.driver_name,
            self.dra_socket,
            self.registration_socket,
        )

    def stop(self, grace: float | None = 5.0) -> None:
        """Deregister (remove the reg socket), end health streams, drain DRA calls, remove both sockets."""
        if self._reg_server is not None:
            self._reg_server.stop(grace).wait()
            self._reg_server = None
        _remove_socket(self.registration_socket)
        if self.health:
            self.health.stop()
        if self._dra_server is not None:
            self._dra_server.stop(grace).wait()
            self._dra_server = None
        _remove_socket(self.dra_socket)

    def __enter__(self) -> PluginServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _serve_dra(self) -> grpc.Server:
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="dra-grpc")
        )
        # The generated add_* functions are untyped; hence the ignores.
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
            DRAPluginV1Servicer(self.runner), server
        )
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
            DRAPluginV1Beta1Servicer(self.runner), server
        )
        if self.health:
            dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(  # type: ignore[no-untyped-call]
                health.HealthV1Alpha1Servicer(self.health), server
            )
            dra_health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(  # type: ignore[no-untyped-call]
                health.HealthV1Servicer(self.health), server
            )
        _bind(server, "dra_socket", self.dra_socket)
        return server

    def _serve_registration(self) -> grpc.Server:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="reg-grpc"))
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
            self.registration, server
        )
        _bind(server, "registration_socket", self.registration_socket)
        return server


def _check_socket_path(field: str, path: Path) -> None:
    if not path.is_absolute():
        raise InvalidInput(f"socket path {path} must be absolute", code=ErrorCode.INVALID_PATH, field=field)
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise InvalidInput(
            f"socket path {path} is longer than {MAX_SOCKET_PATH_BYTES} bytes",
            code=ErrorCode.INVALID_PATH,
            field=field,
        )


def _bind(server: grpc.Server, field: str, path: Path) -> None:
    """Create the directory, remove a stale socket, listen, start, restrict the socket's mode."""
    path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    _remove_socket(path, stale=True)
    try:
        port = server.add_insecure_port(f"unix://{path}")
    except RuntimeError as exc:
        raise InvalidInput(
            f"cannot listen on {path}: {exc}", code=ErrorCode.INVALID_PATH, field=field
        ) from exc
    if port == 0:
        raise InvalidInput(f"cannot listen on {path}", code=ErrorCode.INVALID_PATH, field=field)
    server.start()
    path.chmod(SOCKET_MODE)


def _remove_socket(path: Path, *, stale: bool = False) -> None:
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        raise InvalidInput(
            f"{path} is a directory, not a socket", code=ErrorCode.INVALID_PATH, field=str(path)
        )
    if stale:
        _log.info("removing stale socket %s", path)
    path.unlink(missing_ok=True)
