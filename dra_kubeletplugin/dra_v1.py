"""``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``: decode the kubelet's claims, run, encode.

Thin by design: the rules (validation, fetching, missing results, sub-request names,
serialisation) live in :mod:`dra_kubeletplugin.claimbatch`; this module only converts protobuf
messages and maps a failed call to a gRPC status. The v1 and v1beta1 messages are the same but
for ``Device.share_id`` (v1 only, explicit presence: unset, not ""), so one :class:`Codec` and one
:class:`DRAPluginServicer` serve both; :mod:`dra_kubeletplugin.dra_v1beta1` instantiates them for
v1beta1.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

import grpc

from dra_kubeletplugin import statuses
from dra_kubeletplugin.claimbatch import BatchRunner
from dra_kubeletplugin.claims import ClaimRef, PreparedDevice, PrepareResult
from dra_kubeletplugin.protos.gen import dra_v1_pb2 as pb

SERVICE = "v1.DRAPlugin"

_log = logging.getLogger("dra_kubeletplugin.dra")


class Codec:
    """Conversions between one DRA API version's messages and the domain types."""

    def __init__(self, messages: ModuleType, *, share_id: bool) -> None:
        self.pb = messages
        self.share_id = share_id

    @staticmethod
    def claims_from_proto(claims: Iterable[Any]) -> list[ClaimRef]:
        """Protobuf claims -> domain claim references (no validation; see ``claimbatch``)."""
        return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]

    def device_to_proto(self, device: PreparedDevice) -> Any:
        """One prepared device; ``share_id`` only when the version has it and the domain gave one."""
        msg = self.pb.Device(
            request_names=list(device.request_names),
            pool_name=device.pool,
            device_name=device.device,
            cdi_device_ids=list(device.cdi_device_ids),
        )
        if self.share_id and device.share_id is not None:
            msg.share_id = device.share_id
        return msg

    def prepare_response(self, results: Mapping[str, PrepareResult]) -> Any:
        """The response map, one entry per claim UID in ``results``."""
        response = self.pb.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = response.claims[uid]
            if result.error:
                entry.error = result.error
            else:
                entry.devices.extend(self.device_to_proto(d) for d in result.devices)
        return response

    def unprepare_response(self, results: Mapping[str, str]) -> Any:
        """The response map, one (possibly empty) entry per claim UID in ``results``."""
        response = self.pb.NodeUnprepareResourcesResponse()
        for uid, error in results.items():
            response.claims[uid].error = error
        return response


class DRAPluginServicer:
    """Serves one DRA API version on top of a :class:`BatchRunner`."""

    def __init__(
        self, runner: BatchRunner, codec: Codec, *, table: statuses.ErrorStatus = statuses.status_for
    ) -> None:
        self._runner = runner
        self._codec = codec
        self._table = table

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 - gRPC name
        refs = self._codec.claims_from_proto(request.claims)
        what = _what("NodePrepareResources", refs)  # the call as its failure names it
        try:
            results = self._runner.prepare(refs, deadline=_deadline(context))
        except Exception as exc:  # every failure becomes a status, never a dead server
            statuses.abort_with(context, exc, what=what, log=_log, table=self._table)
        return self._codec.prepare_response(results)

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        refs = self._codec.claims_from_proto(request.claims)
        what = _what("NodeUnprepareResources", refs)  # the call as its failure names it
        try:
            results = self._runner.unprepare(refs, deadline=_deadline(context))
        except Exception as exc:
            statuses.abort_with(context, exc, what=what, log=_log, table=self._table)
        return self._codec.unprepare_response(results)


CODEC = Codec(pb, share_id=True)
claims_from_proto = CODEC.claims_from_proto
device_to_proto = CODEC.device_to_proto
prepare_response = CODEC.prepare_response
unprepare_response = CODEC.unprepare_response


class DRAPluginV1Servicer(DRAPluginServicer):
    """Serves DRA v1."""

    def __init__(self, runner: BatchRunner, *, table: statuses.ErrorStatus = statuses.status_for) -> None:
        super().__init__(runner, CODEC, table=table)


def _deadline(context: grpc.ServicerContext) -> float | None:
    """The kubelet's deadline as ``time.monotonic()``, a second early so the reply still arrives."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + max(remaining - 1.0, 0.0)


def _what(call: str, refs: list[ClaimRef]) -> str:
    """The call's name with the claims it carried (at most a few, for the log and the status)."""
    uids = [r.uid for r in refs[:4]] + ([f"+{len(refs) - 4} more"] if len(refs) > 4 else [])
    return f"{call} ({', '.join(uids) or 'no claims'})"
