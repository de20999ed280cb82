"""``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`` (kubelet 1.32/1.33, and newer via conversion).

The v1 service with v1beta1 messages: ``Device`` has no ``share_id``, so a share ID from the
domain is not sent (kubelets speaking v1beta1 predate it).
"""

from __future__ import annotations

from dra_kubeletplugin import statuses
from dra_kubeletplugin.claimbatch import BatchRunner
from dra_kubeletplugin.dra_v1 import Codec, DRAPluginServicer
from dra_kubeletplugin.protos.gen import dra_v1beta1_pb2 as pb

SERVICE = "v1beta1.DRAPlugin"

CODEC = Codec(pb, share_id=False)
claims_from_proto = CODEC.claims_from_proto
device_to_proto = CODEC.device_to_proto
prepare_response = CODEC.prepare_response
unprepare_response = CODEC.unprepare_response


class DRAPluginV1Beta1Servicer(DRAPluginServicer):
    """Serves DRA v1beta1."""

    def __init__(self, runner: BatchRunner, *, table: statuses.ErrorStatus = statuses.status_for) -> None:
        super().__init__(runner, CODEC, table=table)
