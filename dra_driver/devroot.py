"""An emulated node's device root: the device nodes and driver files a real Ascend node has.

The CDI writer references ``<device root>/dev/davinciN``, the shared device nodes and the
driver mounts (:mod:`dra_driver.discovery.node_files`); a runtime refuses a spec whose paths do
not exist (containerd fails the container with ``CreateContainerError`` after prepare succeeded).
:func:`build_device_root` creates them under ``root``, so ``flexnpu-dra plugin --inventory ...
--build-device-root`` on a node without NPUs, next to a real kubelet, gets containers that start.

Device nodes are character devices with the major/minor of ``/dev/null`` (1:3) when ``mknod``
is allowed (root with CAP_MKNOD), else empty regular files. It never touches paths outside
``root``, follows no symlink below it (one found where a directory, node or file belongs is an
``InvalidPath`` error naming it), and is idempotent: existing entries are left as they are.

Also a command (``python3 -m dra_driver.devroot INVENTORY_FILE DEVICE_ROOT``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from dra_driver.config import Config
from dra_driver.devices import Inventory
from dra_driver.discovery import emulated, node_files
from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput

__all__ = ["NULL_DEVICE", "build_device_root", "build_for_config", "device_paths", "main"]

#: (major, minor) of /dev/null: opening an emulated node is harmless.
NULL_DEVICE = (1, 3)

_EMULATED_NPU_SMI = "#!/bin/sh\necho 'emulated node: npu-smi is not available' >&2\nexit 1\n"


def device_paths(inventory: Inventory) -> tuple[str, ...]:
    """Absolute (container) paths of every device node the inventory needs (pure)."""
    per_die = tuple(
        node_files.die_device_node(d.phy_id) for d in sorted(inventory.dies, key=lambda d: d.phy_id)
    )
    return per_die + node_files.SHARED_DEVICE_NODES


def file_contents(inventory: Inventory) -> dict[str, str]:
    """Contents of the driver files that are not empty on an emulated node (pure)."""
    return {
        "/usr/local/bin/npu-smi": _EMULATED_NPU_SMI,
        "/usr/local/Ascend/driver/version.info": (
            f"Version={inventory.driver_version or 'emulated'}\n"
            f"ascendhal_version=7.35.23\naicpu_version=1.0\ntdt_version=1.0\nlog_version=1.0\n"
        ),
        "/etc/ascend_install.info": (
            "UserName=HwHiAiUser\nUserGroup=HwHiAiUser\n"
            "Driver_Install_Type=full\nDriver_Install_Path_Param=/usr/local/Ascend\n"
        ),
    }


def build_device_root(root: Path, inventory: Inventory) -> None:
    """Create device nodes and driver paths for ``inventory`` under ``root`` (idempotent)."""
    root.mkdir(parents=True, exist_ok=True)
    for dev in device_paths(inventory):
        path = _prepare_parent(root, dev)
        if not _exists_nofollow(path, root):
            _make_device_node(path)
    for directory in node_files.DRIVER_DIRS:
        path = _prepare_parent(root, directory)
        if not _exists_nofollow(path, root):
            with contextlib.suppress(FileExistsError):
                path.mkdir(mode=0o755)
        _refuse_symlink(path, root)
    contents = file_contents(inventory)
    for file in node_files.DRIVER_FILES:
        path = _prepare_parent(root, file)
        if _exists_nofollow(path, root):
            continue
        mode = 0o755 if file.endswith("/npu-smi") else 0o644
        _create_file(path, contents.get(file, ""), mode)


def _refuse_symlink(path: Path, root: Path) -> None:
    if path.is_symlink():
        raise InvalidInput(
            f"device root {root}: {path} is a symlink; refusing to follow it",
            code=ErrorCode.INVALID_PATH,
            field="deviceRoot",
        )


def _exists_nofollow(path: Path, root: Path) -> bool:
    _refuse_symlink(path, root)
    return os.path.lexists(path)


def _prepare_parent(root: Path, absolute: str) -> Path:
    """``root/absolute`` with every directory between made, none of them a symlink."""
    parts = Path(absolute.lstrip("/")).parts
    current = root
    for part in parts[:-1]:
        current = current / part
        _refuse_symlink(current, root)
        with contextlib.suppress(FileExistsError):
            current.mkdir(mode=0o755)
        _refuse_symlink(current, root)
    return root.joinpath(*parts)


def _create_file(path: Path, text: str, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except FileExistsError:
        return  # made concurrently: leave it
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(path, mode, follow_symlinks=False)


def _make_device_node(path: Path) -> None:
    made = False
    if os.geteuid() == 0:
        # EPERM happens in unprivileged containers even as root: fall back to a plain file.
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(*NULL_DEVICE))
            made = True
        except PermissionError:
            pass
        except FileExistsError:
            return
    if not made:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                return
            raise
        os.close(fd)
    os.chmod(path, 0o666, follow_symlinks=False)  # noqa: S103  -- like the real nodes; not subject to the umask


def build_for_config(cfg: Config) -> int:
    """``flexnpu-dra plugin --build-device-root``: build the root of ``cfg.inventory``; returns the die count."""
    if cfg.inventory is None:
        raise InvalidInput(
            "--build-device-root needs --inventory (it creates the emulated dies' device nodes)",
            code=ErrorCode.INVALID_CONFIG,
            field="build-device-root",
        )
    if cfg.paths.device_root == Path("/"):
        raise InvalidInput(
            "--build-device-root needs a --device-root other than / (it never writes emulated nodes into /dev)",
            code=ErrorCode.INVALID_CONFIG,
            field="build-device-root",
        )
    inventory = emulated.load_inventory(cfg.inventory)
    try:
        build_device_root(cfg.paths.device_root, inventory)
    except OSError as exc:
        raise InvalidInput(
            f"cannot build the emulated device root {cfg.paths.device_root}: {exc}",
            code=ErrorCode.INVALID_PATH,
            field="device-root",
        ) from exc
    return len(inventory.dies)


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m dra_driver.devroot INVENTORY_FILE DEVICE_ROOT``: build the root."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        sys.stderr.write("usage: python3 -m dra_driver.devroot INVENTORY_FILE DEVICE_ROOT\n")
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
