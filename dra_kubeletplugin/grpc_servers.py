"""The two gRPC servers of the kubelet plugin: DRA (+ health) on dra.sock, registration on the reg socket.

Start order matters: the kubelet uses the DRA socket right after registering, so the DRA
server is serving before the registration socket appears. Stop order is the reverse:
removing the registration socket deregisters the plugin, then the DRA server drains.
This module owns the socket files (stale ones are removed at start, ours at stop) and the
thread pools; it does not know what preparing a claim means. The DRA server has many more
threads than the claim fetcher has workers: a call holds its thread while it waits for its
claims, so a few slow or flooding callers must not leave none for the next call.
"""

from __future__ import annotations

import logging
import os
import stat
from concurrent import futures
from pathlib import Path
from types import TracebackType

import grpc

from dra_kubeletplugin import health_stream, registration, statuses
from dra_kubeletplugin.claimbatch import BatchRunner
from dra_kubeletplugin.claims import HealthSource
from dra_kubeletplugin.dra_v1 import DRAPluginV1Servicer
from dra_kubeletplugin.dra_v1beta1 import DRAPluginV1Beta1Servicer
from dra_kubeletplugin.errors import InvalidArgument
from dra_kubeletplugin.protos.gen import (
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2_grpc,
)

MAX_SOCKET_PATH_BYTES = 107  # sun_path is 108 bytes including the terminating NUL
SOCKET_MODE = 0o600
DIR_MODE = 0o750
DEFAULT_WORKERS = 32
"""DRA server threads (an open health stream holds one; so does a call waiting for its claims)."""

_log = logging.getLogger("dra_kubeletplugin.grpc_servers")


class PluginServer:
    """Serves one DRA driver to the kubelet over two unix sockets.

    Usage::

        server = PluginServer(driver_name="gpu.example.com", dra_socket=..., registration_socket=...,
                              runner=BatchRunner(driver, fetcher=..., serializer=...), health_source=None)
        server.start()
        ...
        server.notify_health_changed()
        server.stop()

    **Parameters:**

    * ``driver_name`` — the DRA driver name.
    * ``dra_socket`` — absolute path of the DRA service socket (v1, v1beta1, health).
    * ``registration_socket`` — absolute path in the kubelet plugin registry directory.
    * ``runner`` — runs each call's claims against the driver (``claimbatch.py``).
    * ``health_source`` — device health; ``None`` serves and advertises no health service.
    * ``resend_seconds`` — longest gap between two health responses.
    * ``max_workers`` — DRA server threads (an open health stream holds one).
    * ``table`` — maps an exception that failed a whole call to a gRPC status (``statuses.py``).
    """

    def __init__(
        self,
        *,
        driver_name: str,
        dra_socket: Path,
        registration_socket: Path,
        runner: BatchRunner,
        health_source: HealthSource | None,
        resend_seconds: float = health_stream.DEFAULT_RESEND_SECONDS,
        max_workers: int = DEFAULT_WORKERS,
        table: statuses.ErrorStatus = statuses.status_for,
    ) -> None:
        for field, path in (("dra_socket", dra_socket), ("registration_socket", registration_socket)):
            _check_socket_path(field, path)
        self.driver_name = driver_name
        self.dra_socket = dra_socket
        self.registration_socket = registration_socket
        self.runner = runner
        self.table = table
        self.health = (
            health_stream.HealthBroadcaster(health_source, resend_seconds=resend_seconds)
            if health_source
            else None
        )
        if self.health:
            self.health.table = table
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
            raise InvalidArgument("a PluginServer can be started only once; create a new one")
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
            DRAPluginV1Servicer(self.runner, table=self.table), server
        )
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
            DRAPluginV1Beta1Servicer(self.runner, table=self.table), server
        )
        if self.health:
            dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(  # type: ignore[no-untyped-call]
                health_stream.HealthV1Alpha1Servicer(self.health), server
            )
            dra_health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(  # type: ignore[no-untyped-call]
                health_stream.HealthV1Servicer(self.health), server
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
        raise InvalidArgument(f"{field}: socket path {path} must be absolute")
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise InvalidArgument(f"{field}: socket path {path} is longer than {MAX_SOCKET_PATH_BYTES} bytes")


def _bind(server: grpc.Server, field: str, path: Path) -> None:
    """Create the directory, remove a stale socket, listen, start, restrict the socket's mode."""
    path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    _remove_socket(path, stale=True)
    try:
        port = server.add_insecure_port(f"unix://{path}")
    except RuntimeError as exc:
        raise InvalidArgument(f"{field}: cannot listen on {path}: {exc}") from exc
    if port == 0:
        raise InvalidArgument(f"{field}: cannot listen on {path}")
    server.start()
    path.chmod(SOCKET_MODE)


def _remove_socket(path: Path, *, stale: bool = False) -> None:
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        raise InvalidArgument(f"{path} is a directory, not a socket")
    if stale:
        _log.info("removing stale socket %s", path)
    path.unlink(missing_ok=True)
