"""Claim device status (what ``kubectl describe resourceclaim`` shows), written by server-side apply.

The node owns only its own entries of ``status.devices`` (list-map keys driver, pool, device,
shareID): it applies them with a field manager of its own, so other writers' entries and
fields are left alone, and applying an empty list removes exactly the entries it applied
before (that is how unprepare clears them). ``metadata.uid`` in the applied object makes the
API server refuse the write if the claim was replaced by another with the same name.
RBAC: ``resourceclaims/status`` patch, plus ``resourceclaims/driver`` ``associated-node:patch``
for the driver name on 1.36+ (see the Helm chart).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controller.kube import Kube
from dra_kubeletplugin.claims import ClaimRef


class ClaimStatusWriter:
    def __init__(self, kube: Kube, *, driver_name: str, node_name: str) -> None:
        self.kube = kube
        self.field_manager = f"{driver_name}/{node_name}"[:128]

    def body(self, ref: ClaimRef, devices: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
            "status": {"devices": [dict(d) for d in devices]},
        }

    def write(self, ref: ClaimRef, devices: Sequence[Mapping[str, Any]]) -> None:
        self.kube.patch_claim_status(
            ref.namespace,
            ref.name,
            self.body(ref, devices),
            field_manager=self.field_manager,
            content_type="application/apply-patch+yaml",
            force=True,
        )
