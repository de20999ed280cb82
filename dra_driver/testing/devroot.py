"""An emulated node's device root: the device nodes and driver files a real Ascend node has.

The CDI writer references ``<device root>/dev/davinciN``, the shared device nodes and the
driver mounts (:mod:`dra_driver.discovery.node_files`); a runtime (podman in e2e tests)
refuses a spec whose paths do not exist. :func:`build_device_root` creates them under a
temporary root. Device nodes are character devices with the major/minor of ``/dev/null``
(1:3) when ``mknod`` is allowed (root), else empty regular files. It never touches paths
outside ``root`` and is idempotent: existing entries are left as they are.

Also a command, used by the Helm chart's init container on emulated nodes::

    python3 -m dra_driver.testing.devroot INVENTORY_FILE DEVICE_ROOT
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from dra_driver.devices import Inventory
from dra_driver.discovery import emulated, node_files
from dra_driver.errors import FlexNPUError

__all__ = ["NULL_DEVICE", "build_device_root", "device_paths", "main"]

#: (major, minor) of /dev/null: opening an emulated node is harmless.
NULL_DEVICE = (1, 3)


def device_paths(inventory: Inventory) -> tuple[str, ...]:
    """Absolute (container) paths of every device node the inventory needs (pure)."""
    per_die = tuple(
        node_files.die_device_node(d.phy_id) for d in sorted(inventory.dies, key=lambda d: d.phy_id)
    )
    return per_die + node_files.SHARED_DEVICE_NODES


def build_device_root(root: Path, inventory: Inventory) -> None:
    """Create device nodes and driver paths for ``inventory`` under ``root`` (idempotent)."""
    for dev in device_paths(inventory):
        _make_device_node(_under(root, dev))
    for directory in node_files.DRIVER_DIRS:
        _under(root, directory).mkdir(parents=True, exist_ok=True)
    contents = {
        "/usr/local/bin/npu-smi": "#!/bin/sh\necho 'emulated node: npu-smi is not available' >&2\nexit 1\n",
        "/usr/local/Ascend/driver/version.info": (
            f"Version={inventory.driver_version or 'emulated'}\n"
            f"ascendhal_version=7.35.23\naicpu_version=1.0\ntdt_version=1.0\nlog_version=1.0\n"
        ),
        "/etc/ascend_install.info": (
            "UserName=HwHiAiUser\nUserGroup=HwHiAiUser\n"
            "Driver_Install_Type=full\nDriver_Install_Path_Param=/usr/local/Ascend\n"
        ),
    }
    for file in node_files.DRIVER_FILES:
        path = _under(root, file)
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(contents.get(file, ""))
        if file.endswith("/npu-smi"):
            path.chmod(0o755)


def _under(root: Path, absolute: str) -> Path:
    return root / absolute.lstrip("/")


def _make_device_node(path: Path) -> None:
    if path.exists() or path.is_symlink():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    made = False
    if os.geteuid() == 0:
        # EPERM happens in unprivileged containers even as root: fall back to a plain file.
        with contextlib.suppress(PermissionError):
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(*NULL_DEVICE))
            made = True
    if not made:
        path.touch()
    path.chmod(0o666)  # not subject to the umask, like the real nodes


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m dra_driver.testing.devroot INVENTORY_FILE DEVICE_ROOT``: build the root."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        sys.stderr.write("usage: python3 -m dra_driver.testing.devroot INVENTORY_FILE DEVICE_ROOT\n")
        return 2
    try:
        inventory = emulated.load_inventory(Path(args[0]))
        build_device_root(Path(args[1]), inventory)
    except (FlexNPUError, OSError) as exc:
        sys.stderr.write(f"devroot: {exc}\n")
        return 1
    sys.stdout.write(f"devroot: {len(inventory.dies)} die(s) under {args[1]}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
