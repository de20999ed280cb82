"""Where the two sockets of a DRA kubelet plugin live, with and without rolling updates (kubelet ≥ 1.33).

Without a pod UID: ``<registry dir>/<driver>-reg.sock`` and ``<plugins dir>/<driver>/dra.sock``.
With one (the downward API's ``metadata.uid``, so that an old and a new instance can run side by
side during a DaemonSet surge), each instance has its own pair: ``dra-<podUID>.sock`` in the
driver's plugin directory and a registration socket whose basename keeps the full path within
``sun_path`` (107 bytes and the terminating NUL), trying in turn

1. ``<driver>-<podUID>-reg.sock``,
2. ``<driver>-<b64url(sha256(podUID)[:8])>-reg.sock``,
3. ``dra-<b64url(sha256(driver + NUL + podUID)[:16])>-reg.sock``.

Pure: this module only computes paths.
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from dra_kubeletplugin.errors import InvalidArgument

__all__ = [
    "KUBELET_PLUGINS_DIR",
    "KUBELET_REGISTRY_DIR",
    "MAX_SOCKET_PATH_BYTES",
    "Sockets",
    "plugin_sockets",
]

KUBELET_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
KUBELET_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
MAX_SOCKET_PATH_BYTES = 107
"""``sun_path`` is 108 bytes including the terminating NUL."""


@dataclass(frozen=True, slots=True)
class Sockets:
    """The paths one plugin instance serves and locks."""

    plugin_dir: Path  # the driver's own directory (not shared with other plugins)
    dra: Path
    registration: Path
    serialize_lock: Path  # the file lock rolling-update instances serialise on


def plugin_sockets(
    driver_name: str,
    *,
    pod_uid: str | None = None,
    registry_dir: Path = KUBELET_REGISTRY_DIR,
    plugins_dir: Path = KUBELET_PLUGINS_DIR,
) -> Sockets:
    """The socket paths of ``driver_name``'s plugin (per instance when ``pod_uid`` is given)."""
    if not driver_name or "/" in driver_name or driver_name.startswith("."):
        raise InvalidArgument(f"driver name {driver_name!r} cannot name a socket file")
    plugin_dir = plugins_dir / driver_name
    if not pod_uid:
        return Sockets(plugin_dir, plugin_dir / "dra.sock", registry_dir / f"{driver_name}-reg.sock",
                       plugin_dir / "serialize.lock")  # fmt: skip
    if "/" in pod_uid or pod_uid.startswith("."):
        raise InvalidArgument(f"pod UID {pod_uid!r} cannot name a socket file")
    return Sockets(
        plugin_dir,
        plugin_dir / f"dra-{pod_uid}.sock",
        registry_dir / registration_name(driver_name, pod_uid, registry_dir=registry_dir),
        plugin_dir / "serialize.lock",
    )


def registration_name(driver_name: str, pod_uid: str, *, registry_dir: Path) -> str:
    """The first of the three basenames (module docstring) whose full path fits in ``sun_path``."""
    both = (driver_name + "\0" + pod_uid).encode()
    for name in (
        f"{driver_name}-{pod_uid}-reg.sock",
        f"{driver_name}-{_b64(hashlib.sha256(pod_uid.encode()).digest()[:8])}-reg.sock",
        f"dra-{_b64(hashlib.sha256(both).digest()[:16])}-reg.sock",
    ):
        if len(os.fsencode(registry_dir / name)) <= MAX_SOCKET_PATH_BYTES:
            return name
    raise InvalidArgument(f"the registry directory {registry_dir} leaves no room for a socket name")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")
