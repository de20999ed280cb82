"""The host files an Ascend container needs besides its ``/dev/davinciN`` node.

Source: mind-cluster's ``ascend-common/cdi/devnode.go`` and the Ascend Docker Runtime: the shared
device nodes every Ascend container needs, and the driver files the Ascend Docker Runtime
mounts by default (``base.list``) plus the ones HAMi's soft split adds (``version.info``,
``/etc/ascend_install.info``).

Paths are absolute container paths; on the host they are the same paths under the
configured device root (``--device-root``, ``/`` on a real node). The CDI writer imports
these tables; :mod:`flexnpu_testing.devroot` creates them on an emulated node. This
module holds constants only.
"""

from __future__ import annotations

__all__ = [
    "DRIVER_DIRS",
    "DRIVER_FILES",
    "DRIVER_MOUNTS",
    "SHARED_DEVICE_NODES",
    "die_device_node",
]

#: Character devices shared by all dies; every Ascend container needs them.
SHARED_DEVICE_NODES: tuple[str, ...] = (
    "/dev/davinci_manager",
    "/dev/devmm_svm",
    "/dev/hisi_hdc",
)

#: Driver directories bind-mounted read-only into whole-die containers.
DRIVER_DIRS: tuple[str, ...] = (
    "/usr/local/Ascend/driver/lib64",
    "/usr/local/Ascend/driver/include",
    "/usr/local/dcmi",
)

#: Driver files bind-mounted read-only into whole-die containers.
DRIVER_FILES: tuple[str, ...] = (
    "/usr/local/bin/npu-smi",
    "/usr/local/Ascend/driver/version.info",
    "/etc/ascend_install.info",
)

#: Every driver mount (directories first, then files); container path == host path.
DRIVER_MOUNTS: tuple[str, ...] = DRIVER_DIRS + DRIVER_FILES


def die_device_node(phy_id: int) -> str:
    """The per-die device node, ``/dev/davinci<phy_id>``."""
    return f"/dev/davinci{phy_id}"
