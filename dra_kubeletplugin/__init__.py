"""A kubelet-plugin helper for DRA drivers written in Python (the Go ``kubeletplugin`` + ``resourceslice`` helpers).

A driver implements :class:`DRAPlugin` (prepare and unprepare of claims) and calls :func:`start`;
the helper owns registration with the kubelet, both DRA API versions (v1, v1beta1), fetching and
checking the claims, serialisation of calls, rolling-update sockets, the device-health stream and
the publishing of the ResourceSlices the driver describes (:meth:`Helper.publish_resources`). See
``dra_kubeletplugin/README.md``. It imports nothing of any particular driver.

Importing this package is cheap: the gRPC parts load when :func:`start` or :class:`Helper` is
first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dra_kubeletplugin.claims import (
    CALL_DEADLINE,
    ClaimRef,
    DeviceHealthReport,
    DRAPlugin,
    HealthSource,
    PreparedDevice,
    PrepareResult,
    ResourceClaim,
)
from dra_kubeletplugin.errors import ClaimReason, ClaimRejected, PluginError
from dra_kubeletplugin.resourceslice.pools import DriverResources, Pool

if TYPE_CHECKING:
    from dra_kubeletplugin.helper import Helper, PublishOptions, start
    from dra_kubeletplugin.kubeapi import KubeClient

__all__ = [
    "CALL_DEADLINE",
    "ClaimReason",
    "ClaimRef",
    "ClaimRejected",
    "DRAPlugin",
    "DeviceHealthReport",
    "DriverResources",
    "HealthSource",
    "Helper",
    "KubeClient",
    "PluginError",
    "Pool",
    "PrepareResult",
    "PreparedDevice",
    "PublishOptions",
    "ResourceClaim",
    "start",
]

_LAZY = {
    "Helper": "dra_kubeletplugin.helper",
    "PublishOptions": "dra_kubeletplugin.helper",
    "start": "dra_kubeletplugin.helper",
    "KubeClient": "dra_kubeletplugin.kubeapi",
}


def __getattr__(name: str) -> Any:
    """The gRPC-heavy names, imported on first use."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
