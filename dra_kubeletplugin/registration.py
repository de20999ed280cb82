"""The plugin registration service the kubelet's plugin watcher calls on ``<driver>-reg.sock``.

GetInfo tells the kubelet this is a DRA plugin, its driver name, the absolute path of the
DRA socket and the service identifiers it speaks (``"v1.DRAPlugin"`` first: the kubelet
picks the first one in *our* order that it knows). NotifyRegistrationStatus records the
kubelet's verdict; a rejection is answered with a gRPC error that carries the reason.
:func:`other_instances` is the client side: which other instances of the driver the kubelet's
registry holds (a rolling update's other pod), asked through their GetInfo.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import grpc

from dra_kubeletplugin.errors import InvalidArgument
from dra_kubeletplugin.protos.gen import pluginregistration_v1_pb2 as pb
from dra_kubeletplugin.protos.gen import pluginregistration_v1_pb2_grpc as pb_grpc

PLUGIN_TYPE = "DRAPlugin"
DRA_SERVICES: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
HEALTH_SERVICES: tuple[str, ...] = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
SUPPORTED_SERVICES: tuple[str, ...] = DRA_SERVICES + HEALTH_SERVICES

_log = logging.getLogger("dra_kubeletplugin.registration")


class RegistrationServicer(pb_grpc.RegistrationServicer):
    """``pluginregistration.Registration`` for one DRA driver.

    **Parameters:**

    * ``driver_name`` — the DRA driver name (as in ResourceSlices).
    * ``endpoint`` — absolute path of the DRA service socket.
    * ``supported_versions`` — advertised service identifiers, preferred first.

    **Attributes:** ``registered`` (a ``threading.Event``, set while the kubelet accepts the
    plugin), ``notified`` (set once any status arrived), ``last_error`` (the kubelet's last
    rejection reason, "" after an acceptance).
    """

    def __init__(
        self, *, driver_name: str, endpoint: Path, supported_versions: Sequence[str] = SUPPORTED_SERVICES
    ) -> None:
        if not driver_name:
            raise InvalidArgument("the driver name must not be empty")
        if not endpoint.is_absolute():
            raise InvalidArgument(f"the DRA endpoint {endpoint} must be an absolute path")
        if not supported_versions:
            raise InvalidArgument("at least one supported service is required")
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.supported_versions = tuple(supported_versions)
        self.registered = threading.Event()
        self.notified = threading.Event()
        self.last_error = ""

    def GetInfo(  # noqa: N802 - gRPC method name
        self, request: pb.InfoRequest, context: grpc.ServicerContext
    ) -> pb.PluginInfo:
        return pb.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=str(self.endpoint),
            supported_versions=list(self.supported_versions),
        )

    def NotifyRegistrationStatus(  # noqa: N802 - gRPC method name
        self, request: pb.RegistrationStatus, context: grpc.ServicerContext
    ) -> pb.RegistrationStatusResponse:
        if request.plugin_registered:
            self.last_error = ""
            self.registered.set()
            self.notified.set()
            _log.info("kubelet registered DRA driver %s at %s", self.driver_name, self.endpoint)
            return pb.RegistrationStatusResponse()
        self.last_error = request.error or "no reason given"
        self.registered.clear()
        self.notified.set()
        _log.error("kubelet rejected DRA driver %s: %s", self.driver_name, self.last_error)
        context.abort(grpc.StatusCode.UNKNOWN, f"registration failed: {self.last_error}")
        raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def other_instances(
    registry_dir: Path, driver_name: str, own_endpoint: str, *, timeout: float = 2.0
) -> list[str]:
    """Endpoints of other live instances of this driver: registration sockets in the kubelet's registry
    that answer GetInfo as this driver with another endpoint (a rolling update's other pod)."""
    found = []
    for sock in sorted(registry_dir.glob(f"{driver_name}*-reg.sock")):
        try:
            with grpc.insecure_channel(f"unix:{sock}") as channel:
                stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
                info = stub.GetInfo(pb.InfoRequest(), timeout=timeout)
        except grpc.RpcError:
            continue  # a stale socket: nobody serves it
        if info.name == driver_name and info.endpoint != own_endpoint:
            found.append(info.endpoint)
    return found
