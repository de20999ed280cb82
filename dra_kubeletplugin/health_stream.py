"""``DRAResourceHealth`` (v1alpha1 and v1): stream the health of every published device.

Each response carries the complete device set. A stream sends it at once, again whenever
:meth:`HealthBroadcaster.notify_changed` is called, and at least every ``resend_seconds``
(the kubelet marks an entry Unknown when it is not refreshed within
``health_check_timeout_seconds``). Waiting is on a ``threading.Condition``, never a polling
sleep. A stream ends cleanly when the client cancels or :meth:`HealthBroadcaster.stop` runs.
v1alpha1 and v1 share their messages, so one broadcaster serves both services.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import grpc

from dra_kubeletplugin import statuses
from dra_kubeletplugin.claims import DeviceHealthReport, HealthSource
from dra_kubeletplugin.errors import InvalidArgument
from dra_kubeletplugin.protos.gen import dra_health_v1_pb2 as v1_pb
from dra_kubeletplugin.protos.gen import dra_health_v1_pb2_grpc as v1_grpc
from dra_kubeletplugin.protos.gen import dra_health_v1alpha1_pb2 as v1alpha1_pb
from dra_kubeletplugin.protos.gen import dra_health_v1alpha1_pb2_grpc as v1alpha1_grpc

HEALTH_CHECK_TIMEOUT_SECONDS = 30
DEFAULT_RESEND_SECONDS = 10.0
MAX_MESSAGE_CHARS = 1024
_ELLIPSIS = "..."

_log = logging.getLogger("dra_kubeletplugin.health_stream")


def truncate_message(message: str) -> str:
    """At most :data:`MAX_MESSAGE_CHARS` characters, ending in "..." when cut (as the kubelet does)."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[: MAX_MESSAGE_CHARS - len(_ELLIPSIS)] + _ELLIPSIS


def health_response(
    pb: Any,
    reports: Sequence[DeviceHealthReport],
    *,
    now: int,
    timeout_seconds: int = HEALTH_CHECK_TIMEOUT_SECONDS,
) -> Any:
    """A ``NodeWatchResourcesResponse`` of module ``pb`` (v1alpha1 or v1) for ``reports``."""
    response = pb.NodeWatchResourcesResponse()
    for report in reports:
        status = pb.UNKNOWN if report.healthy is None else pb.HEALTHY if report.healthy else pb.UNHEALTHY
        response.devices.append(
            pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=report.pool, device_name=report.device),
                health=status,
                last_updated_time=now,
                health_check_timeout_seconds=timeout_seconds,
                message=truncate_message(report.message),
            )
        )
    return response


class HealthBroadcaster:
    """Feeds every open health stream from one :class:`HealthSource`.

    **Parameters:**

    * ``source`` — gives the full device health list on each call.
    * ``resend_seconds`` — longest gap between two responses (must be below ``timeout_seconds``).
    * ``timeout_seconds`` — ``health_check_timeout_seconds`` sent with every device.
    """

    def __init__(
        self,
        source: HealthSource,
        *,
        resend_seconds: float = DEFAULT_RESEND_SECONDS,
        timeout_seconds: int = HEALTH_CHECK_TIMEOUT_SECONDS,
    ) -> None:
        if not 0 < resend_seconds < timeout_seconds:
            raise InvalidArgument(
                f"resend interval {resend_seconds}s must be > 0 and below the {timeout_seconds}s health timeout"
            )
        self._source = source
        self.table: statuses.ErrorStatus = statuses.status_for
        """Maps a failure of the health source to a gRPC status (the helper sets the driver's)."""
        self._resend = resend_seconds
        self._timeout = timeout_seconds
        self._cond = threading.Condition()
        self._generation = 0
        self._stopped = False

    def notify_changed(self) -> None:
        """Device health changed: every stream sends the full set now."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def stop(self) -> None:
        """End every stream (and refuse new ones) at its next wake-up, which is now."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def stream(self, pb: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        """The responses of one ``NodeWatchResources`` call, for message module ``pb``."""
        done = threading.Event()

        def _on_done() -> None:
            done.set()
            with self._cond:
                self._cond.notify_all()

        if not context.add_callback(_on_done):
            return  # the RPC already ended
        seen: int | None = None
        while True:
            seen = self._wait(seen, done)
            if seen is None:
                return
            try:
                reports = self._source.device_health()
            except Exception as exc:
                statuses.abort_with(context, exc, what="NodeWatchResources", log=_log, table=self.table)
            yield health_response(pb, reports, now=int(time.time()), timeout_seconds=self._timeout)

    def _wait(self, seen: int | None, done: threading.Event) -> int | None:
        """Block until a change, the resend deadline, a stop or a cancel; ``None`` means end the stream."""
        with self._cond:
            if seen is not None:
                self._cond.wait_for(
                    lambda: self._stopped or done.is_set() or self._generation != seen, timeout=self._resend
                )
            if self._stopped or done.is_set():
                return None
            return self._generation


class HealthV1Alpha1Servicer(v1alpha1_grpc.DRAResourceHealthServicer):
    """``v1alpha1.DRAResourceHealth`` (kubelet 1.34-1.36, and 1.37 as a fallback)."""

    def __init__(self, broadcaster: HealthBroadcaster) -> None:
        self._broadcaster = broadcaster

    def NodeWatchResources(  # noqa: N802 - gRPC method name
        self, request: v1alpha1_pb.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[v1alpha1_pb.NodeWatchResourcesResponse]:
        _log.info("kubelet opened a v1alpha1 health stream")
        yield from self._broadcaster.stream(v1alpha1_pb, context)


class HealthV1Servicer(v1_grpc.DRAResourceHealthServicer):
    """``v1.DRAResourceHealth`` (kubelet 1.37+, preferred over v1alpha1)."""

    def __init__(self, broadcaster: HealthBroadcaster) -> None:
        self._broadcaster = broadcaster

    def NodeWatchResources(  # noqa: N802 - gRPC method name
        self, request: v1_pb.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[v1_pb.NodeWatchResourcesResponse]:
        _log.info("kubelet opened a v1 health stream")
        yield from self._broadcaster.stream(v1_pb, context)
