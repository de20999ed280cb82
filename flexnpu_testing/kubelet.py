"""A kubelet simulator for the DRA plugin: registration, prepare/unprepare and health, over real sockets.

It behaves like the kubelet's plugin watcher and DRA manager (kubelet 1.36):

* finds ``<driver>-reg.sock`` (or any ``*-reg.sock`` not starting with ``.``) in the registry
  directory, calls ``GetInfo``, checks ``type == "DRAPlugin"`` and the driver name, and picks
  the first service *in the plugin's order* that it knows (``v1.DRAPlugin``, ``v1beta1.DRAPlugin``
  by default; pass ``supported_services`` to act like an older kubelet). No match: it sends
  ``NotifyRegistrationStatus(plugin_registered=False)`` and raises :class:`RegistrationRejected`.
* waits until the DRA endpoint answers, then sends ``NotifyRegistrationStatus(True)``;
* makes one call per driver with a 45 s deadline and applies the kubelet's response checks
  (an entry for every requested claim, no unknown UIDs); per-claim errors are returned, not raised;
* opens the health stream on the service the plugin advertises (v1 preferred over v1alpha1).

CLI (prints JSON)::

    python -m flexnpu_testing.kubelet --registry-dir D [--driver N] [--api v1beta1] \\
        prepare|unprepare|info --claim ns/name/uid ...
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc

from dra_kubeletplugin.claims import ClaimRef, DeviceHealthReport, PreparedDevice
from dra_kubeletplugin.claims import PrepareResult as ClaimResult
from dra_kubeletplugin.protos.gen import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)

KUBELET_SERVICES: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
KUBELET_HEALTH_SERVICES: tuple[str, ...] = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
CALL_TIMEOUT_SECONDS = 45.0
_POLL_SECONDS = 0.02

_DRA_MODULES: dict[str, tuple[Any, Any]] = {
    "v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc),
    "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}
_HEALTH_MODULES: dict[str, tuple[Any, Any]] = {
    "v1.DRAResourceHealth": (dra_health_v1_pb2, dra_health_v1_pb2_grpc),
    "v1alpha1.DRAResourceHealth": (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc),
}


class KubeletError(Exception):
    """A call failed the way it would fail in the kubelet (gRPC error or a bad response)."""

    def __init__(self, message: str, *, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class RegistrationRejected(KubeletError):
    """The simulated kubelet refused the plugin (it was told so via NotifyRegistrationStatus)."""


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """What GetInfo returned."""

    type: str
    name: str
    endpoint: str
    supported_versions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class HealthUpdate:
    """One health stream response: the devices, plus the raw protobuf message."""

    devices: tuple[DeviceHealthReport, ...]
    raw: Any


class HealthWatch:
    """An open health stream read by a background thread into a queue.

    ``next(timeout)`` returns the next :class:`HealthUpdate` or raises ``queue.Empty``;
    ``ended`` is set when the stream ends, with ``end_code`` (``OK`` for a clean end).
    """

    def __init__(self, call: Any, service: str) -> None:
        self.service = service
        self.ended = threading.Event()
        self.end_code: grpc.StatusCode | None = None
        self.end_details = ""
        self._call = call
        self._queue: queue.Queue[HealthUpdate] = queue.Queue()
        self._thread = threading.Thread(target=self._read, name="kubelet-sim-health", daemon=True)
        self._thread.start()

    def next(self, timeout: float = 10.0) -> HealthUpdate:
        return self._queue.get(timeout=timeout)

    def __iter__(self) -> Iterator[HealthUpdate]:
        while not (self.ended.is_set() and self._queue.empty()):
            try:
                yield self._queue.get(timeout=0.1)
            except queue.Empty:
                continue

    def close(self) -> None:
        self._call.cancel()
        self._thread.join(timeout=10)

    def _read(self) -> None:
        try:
            for response in self._call:
                self._queue.put(HealthUpdate(devices=_health_from_proto(response), raw=response))
            self.end_code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            self.end_code = exc.code()
            self.end_details = exc.details() or ""
        finally:
            self.ended.set()


class PluginHandle:
    """A registered plugin as the kubelet sees it: one channel to its DRA endpoint."""

    def __init__(self, info: PluginInfo, service: str, *, call_timeout: float = CALL_TIMEOUT_SECONDS) -> None:
        self.info = info
        self.service = service
        self.call_timeout = call_timeout
        self._channel = grpc.insecure_channel(f"unix:{info.endpoint}")
        self._pb, pb_grpc = _DRA_MODULES[service]
        self._stub = pb_grpc.DRAPluginStub(self._channel)

    @property
    def driver_name(self) -> str:
        return self.info.name

    def wait_ready(self, timeout: float) -> None:
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError as exc:
            raise KubeletError(f"DRA endpoint {self.info.endpoint} is not serving") from exc

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        """NodePrepareResources; per-claim errors are in the results, call failures raise."""
        request = self._pb.NodePrepareResourcesRequest(claims=[_claim(self._pb, c) for c in claims])
        response = self._call(self._stub.NodePrepareResources, request, "NodePrepareResources")
        _check_uids(claims, response.claims, "prepare")
        return {uid: _result_from_proto(entry) for uid, entry in response.claims.items()}

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """NodeUnprepareResources; returns UID -> error ("" = released)."""
        request = self._pb.NodeUnprepareResourcesRequest(claims=[_claim(self._pb, c) for c in claims])
        response = self._call(self._stub.NodeUnprepareResources, request, "NodeUnprepareResources")
        _check_uids(claims, response.claims, "unprepare")
        return {uid: entry.error for uid, entry in response.claims.items()}

    def watch_health(self, service: str | None = None) -> HealthWatch:
        """Open NodeWatchResources on ``service``, or the best one the plugin advertises."""
        if service is None:
            advertised = [s for s in KUBELET_HEALTH_SERVICES if s in self.info.supported_versions]
            if not advertised:
                raise KubeletError(f"plugin {self.info.name} advertises no health service")
            service = advertised[0]
        pb, pb_grpc = _HEALTH_MODULES[service]
        call = pb_grpc.DRAResourceHealthStub(self._channel).NodeWatchResources(pb.NodeWatchResourcesRequest())
        return HealthWatch(call, service)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> PluginHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: Any, request: Any, name: str) -> Any:
        try:
            return method(request, timeout=self.call_timeout)
        except grpc.RpcError as exc:
            raise KubeletError(f"{name} failed: {exc.code()}: {exc.details()}", code=exc.code()) from exc


class KubeletSimulator:
    """Registers DRA plugins found in ``registry_dir`` and talks to them like the kubelet.

    **Parameters:**

    * ``registry_dir`` — the plugin registry directory (``/var/lib/kubelet/plugins_registry``).
    * ``supported_services`` — DRA services this "kubelet" speaks, e.g. ``("v1beta1.DRAPlugin",)``
      for a 1.32 kubelet.
    * ``call_timeout`` — deadline of each prepare/unprepare call.
    """

    def __init__(
        self,
        registry_dir: Path,
        *,
        supported_services: Sequence[str] = KUBELET_SERVICES,
        call_timeout: float = CALL_TIMEOUT_SECONDS,
    ) -> None:
        self.registry_dir = registry_dir
        self.supported_services = tuple(supported_services)
        self.call_timeout = call_timeout

    def wait_for_plugin(self, driver_name: str, timeout: float = 10.0) -> PluginHandle:
        """Wait for the driver's registration socket, register it, return a handle to its DRA endpoint."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while True:
            for sock in self._candidates(driver_name):
                try:
                    return self._register(sock, driver_name, deadline)
                except RegistrationRejected:
                    raise
                except (KubeletError, grpc.RpcError) as exc:
                    last_error = exc
            if time.monotonic() >= deadline:
                raise KubeletError(
                    f"no DRA plugin {driver_name} registered in {self.registry_dir} within {timeout}s"
                    + (f": {last_error}" if last_error else "")
                )
            threading.Event().wait(_POLL_SECONDS)  # a polled condition with a deadline

    def _candidates(self, driver_name: str) -> list[Path]:
        if not self.registry_dir.is_dir():
            return []
        found = sorted(
            p
            for p in self.registry_dir.iterdir()
            if p.name.endswith("-reg.sock") and not p.name.startswith(".")
        )
        preferred = [p for p in found if p.name == f"{driver_name}-reg.sock"]
        return preferred + [p for p in found if p not in preferred]

    def _register(self, sock: Path, driver_name: str, deadline: float) -> PluginHandle:
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            remaining = max(deadline - time.monotonic(), 0.1)
            raw = stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=remaining)
            info = PluginInfo(raw.type, raw.name, raw.endpoint, tuple(raw.supported_versions))
            if info.name != driver_name:
                raise KubeletError(f"{sock} belongs to {info.name!r}, not {driver_name!r}")
            try:
                service = self._validate(info)
            except RegistrationRejected as exc:
                _notify(stub, registered=False, error=str(exc))
                raise
            handle = PluginHandle(info, service, call_timeout=self.call_timeout)
            try:
                handle.wait_ready(max(deadline - time.monotonic(), 0.1))
                _notify(stub, registered=True, error="")
            except BaseException:
                handle.close()
                raise
            return handle

    def _validate(self, info: PluginInfo) -> str:
        if info.type != "DRAPlugin":
            raise RegistrationRejected(f"plugin type {info.type!r} is not DRAPlugin")
        if not info.endpoint:
            raise RegistrationRejected("plugin gave no endpoint")
        for service in info.supported_versions:
            if service in self.supported_services:
                return service
        raise RegistrationRejected(
            f"none of services supported by the plugin {list(info.supported_versions)} "
            f"are supported by the kubelet {list(self.supported_services)}"
        )


def parse_claim(text: str) -> ClaimRef:
    """``"ns/name/uid"`` -> :class:`ClaimRef` (the CLI's claim syntax)."""
    parts = text.split("/")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"claim {text!r} is not namespace/name/uid")
    return ClaimRef(namespace=parts[0], name=parts[1], uid=parts[2])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flexnpu_testing.kubelet", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--registry-dir", type=Path, required=True, help="kubelet plugin registry directory")
    parser.add_argument("--driver", default="npu.flexnpu.io", help="DRA driver name (default npu.flexnpu.io)")
    parser.add_argument(
        "--api",
        choices=("v1", "v1beta1"),
        default=None,
        help="force one DRA API version (default: negotiate)",
    )
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for the plugin (default 10)"
    )
    parser.add_argument("verb", choices=("prepare", "unprepare", "info"))
    parser.add_argument("--claim", type=parse_claim, action="append", default=[], help="namespace/name/uid")
    args = parser.parse_args(argv)
    services = (f"{args.api}.DRAPlugin",) if args.api else KUBELET_SERVICES
    try:
        with KubeletSimulator(args.registry_dir, supported_services=services).wait_for_plugin(
            args.driver, args.timeout
        ) as plugin:
            out: dict[str, Any] = {"driver": plugin.driver_name, "service": plugin.service}
            if args.verb == "info":
                out["info"] = asdict(plugin.info)
            elif args.verb == "prepare":
                out["claims"] = {uid: asdict(result) for uid, result in plugin.prepare(args.claim).items()}
            else:
                out["claims"] = {uid: {"error": error} for uid, error in plugin.unprepare(args.claim).items()}
    except KubeletError as exc:
        sys.stdout.write(json.dumps({"error": str(exc), "code": exc.code.name if exc.code else None}) + "\n")
        return 1
    sys.stdout.write(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return 0


def _notify(stub: Any, *, registered: bool, error: str) -> None:
    status = pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=registered, error=error)
    try:
        stub.NotifyRegistrationStatus(status, timeout=CALL_TIMEOUT_SECONDS)
    except grpc.RpcError as exc:
        if registered:
            raise KubeletError(f"NotifyRegistrationStatus failed: {exc.details()}", code=exc.code()) from exc
        # The plugin answers a rejection with an error; the kubelet only logs it.


def _claim(pb: Any, ref: ClaimRef) -> Any:
    return pb.Claim(namespace=ref.namespace, uid=ref.uid, name=ref.name)


def _check_uids(claims: Sequence[ClaimRef], got: Any, verb: str) -> None:
    wanted = {c.uid for c in claims}
    unknown = sorted(set(got) - wanted)
    if unknown:
        raise KubeletError(f"{verb}: plugin returned results for unknown claims {unknown}")
    if len(got) < len(wanted):
        raise KubeletError(f"{verb}: plugin skipped {len(wanted) - len(got)} ResourceClaims")


def _result_from_proto(entry: Any) -> ClaimResult:
    if entry.error:
        return ClaimResult(error=entry.error)
    devices = tuple(
        PreparedDevice(
            request_names=tuple(d.request_names),
            pool=d.pool_name,
            device=d.device_name,
            cdi_device_ids=tuple(d.cdi_device_ids),
            share_id=_share_id(d),
        )
        for d in entry.devices
    )
    return ClaimResult(devices=devices)


def _share_id(device: Any) -> str | None:
    """v1 ``share_id`` when present; ``None`` when unset or for v1beta1 (which has no such field)."""
    if "share_id" in device.DESCRIPTOR.fields_by_name and device.HasField("share_id"):
        return str(device.share_id)
    return None


def _health_from_proto(response: Any) -> tuple[DeviceHealthReport, ...]:
    pb = dra_health_v1_pb2  # the enum numbers are the same in v1alpha1
    healthy = {pb.HEALTHY: True, pb.UNHEALTHY: False}
    return tuple(
        DeviceHealthReport(
            pool=d.device.pool_name,
            device=d.device.device_name,
            healthy=healthy.get(d.health),
            message=d.message,
        )
        for d in response.devices
    )


if __name__ == "__main__":
    sys.exit(main())
