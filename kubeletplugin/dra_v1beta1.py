"""``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`` (kubelet 1.32/1.33, and newer via conversion).

Same shape as :mod:`kubeletplugin.dra_v1`, with v1beta1 messages: ``Device`` has no
``share_id``, so a share ID from the domain is not sent (kubelets speaking v1beta1 predate it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import grpc

from api_protos.gen import dra_v1beta1_pb2 as pb
from api_protos.gen import dra_v1beta1_pb2_grpc as pb_grpc
from dra_driver.claims import ClaimRef, ClaimResult, PreparedDevice
from dra_driver.logs import ClaimLogger, claim_logger
from kubeletplugin import statuses
from kubeletplugin.claimbatch import BatchRunner

SERVICE = "v1beta1.DRAPlugin"


def claims_from_proto(claims: Iterable[pb.Claim]) -> list[ClaimRef]:
    """Protobuf claims -> domain claim references (no validation; see ``claimbatch``)."""
    return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]


def device_to_proto(device: PreparedDevice) -> pb.Device:
    """One prepared device (v1beta1 has no ``share_id``; it is dropped)."""
    return pb.Device(
        request_names=list(device.request_names),
        pool_name=device.pool,
        device_name=device.device,
        cdi_device_ids=list(device.cdi_device_ids),
    )


def prepare_response(results: Mapping[str, ClaimResult]) -> pb.NodePrepareResourcesResponse:
    """The response map, one entry per claim UID in ``results``."""
    response = pb.NodePrepareResourcesResponse()
    for uid, result in results.items():
        entry = response.claims[uid]
        if result.error:
            entry.error = result.error
        else:
            entry.devices.extend(device_to_proto(d) for d in result.devices)
    return response


def unprepare_response(results: Mapping[str, str]) -> pb.NodeUnprepareResourcesResponse:
    """The response map, one (possibly empty) entry per claim UID in ``results``."""
    response = pb.NodeUnprepareResourcesResponse()
    for uid, error in results.items():
        response.claims[uid].error = error
    return response


class DRAPluginV1Beta1Servicer(pb_grpc.DRAPluginServicer):
    """Serves DRA v1beta1 on top of a :class:`BatchRunner`."""

    def __init__(self, runner: BatchRunner) -> None:
        self._runner = runner

    def NodePrepareResources(  # noqa: N802 - gRPC method name
        self, request: pb.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> pb.NodePrepareResourcesResponse:
        refs = claims_from_proto(request.claims)
        try:
            results = self._runner.prepare(refs)
        except Exception as exc:  # every failure becomes a status, never a dead server
            statuses.abort_with(context, exc, what="NodePrepareResources", log=_batch_log(refs))
        return prepare_response(results)

    def NodeUnprepareResources(  # noqa: N802 - gRPC method name
        self, request: pb.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> pb.NodeUnprepareResourcesResponse:
        refs = claims_from_proto(request.claims)
        try:
            results = self._runner.unprepare(refs)
        except Exception as exc:
            statuses.abort_with(context, exc, what="NodeUnprepareResources", log=_batch_log(refs))
        return unprepare_response(results)


def _batch_log(refs: list[ClaimRef]) -> ClaimLogger:
    return claim_logger(",".join(r.uid for r in refs) or "-")
