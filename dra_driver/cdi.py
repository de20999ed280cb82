"""CDI specs: the spec as data (pure), its version and validity rules, and one small writer.

One transient spec file per claim, in the CDI directory (``/var/run/cdi`` by default), named
``<vendor>-<class>_<claimUID>.json`` (the CDI library's transient-spec convention). Device
names are ``<claimUID>-<device>``, so a runtime's spec cache never returns a stale entry for a
reused name. ``cdiVersion`` is the *minimum* the content needs (rules from the upstream
library's ``requiredVersion``), so podman 4.3.1 (≤ 0.5.0) and containerd both load it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver import files, paths
from dra_driver.errors import ErrorCode, InvalidInput

_VENDOR_RE = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CLASS_RE = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")


@dataclass(frozen=True, slots=True)
class DeviceNode:
    path: str  # in the container
    host_path: str
    permissions: str = "rw"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "hostPath": self.host_path, "permissions": self.permissions}


@dataclass(frozen=True, slots=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ("ro", "nosuid", "nodev", "rbind")

    def to_json(self) -> dict[str, Any]:
        return {
            "hostPath": self.host_path,
            "containerPath": self.container_path,
            "type": "bind",
            "options": list(self.options),
        }


@dataclass(frozen=True, slots=True)
class Edits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [d.to_json() for d in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_json() for m in self.mounts]
        return out

    def empty(self) -> bool:
        return not (self.env or self.device_nodes or self.mounts)


@dataclass(frozen=True, slots=True)
class CDIDevice:
    name: str
    edits: Edits


@dataclass(frozen=True, slots=True)
class Kind:
    vendor: str
    cls: str

    @classmethod
    def parse(cls, kind: str) -> Kind:
        vendor, sep, klass = kind.partition("/")
        if not sep or not _VENDOR_RE.match(vendor) or not _CLASS_RE.match(klass) or len(klass) > 63:
            raise InvalidInput(
                f"CDI kind {kind!r} is not <vendor>/<class>", code=ErrorCode.INVALID_CDI, field="cdi-kind"
            )
        return cls(vendor, klass)

    def __str__(self) -> str:
        return f"{self.vendor}/{self.cls}"


@dataclass(frozen=True, slots=True)
class Spec:
    kind: Kind
    devices: tuple[CDIDevice, ...]
    edits: Edits = field(default_factory=Edits)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "cdiVersion": required_version(self),
            "kind": str(self.kind),
            "devices": [{"name": d.name, "containerEdits": d.edits.to_json()} for d in self.devices],
        }
        if not self.edits.empty():
            doc["containerEdits"] = self.edits.to_json()
        return doc


def device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def qualified_id(kind: Kind, name: str) -> str:
    """The fully qualified CDI device ID returned to the kubelet: ``vendor/class=name``."""
    return f"{kind}={name}"


def required_version(spec: Spec) -> str:
    """Minimum cdiVersion for the features the spec uses (upstream ``requiredVersion`` rules)."""
    need = "0.3.0"

    def bump(v: str) -> None:
        nonlocal need
        if _VERSIONS.index(v) > _VERSIONS.index(need):
            need = v

    all_edits = [spec.edits, *(d.edits for d in spec.devices)]
    if any(e.mounts for e in all_edits):
        bump("0.4.0")  # mount type
    if any(n.host_path for e in all_edits for n in e.device_nodes):
        bump("0.5.0")  # deviceNode hostPath
    if any(d.name[:1].isdigit() for d in spec.devices):
        bump("0.5.0")  # device name starting with a digit
    if "." in spec.kind.cls:
        bump("0.6.0")
    return need


def validate(spec: Spec, *, claim_uid: str | None = None) -> None:
    """The checks the CDI library makes at load time that the JSON schema does not."""

    def bad(msg: str, fld: str) -> InvalidInput:
        return InvalidInput(msg, code=ErrorCode.INVALID_CDI, claim_uid=claim_uid, field=fld)

    if not spec.devices:
        raise bad("a CDI spec needs at least one device", "devices")
    seen: set[str] = set()
    for i, dev in enumerate(spec.devices):
        if not _NAME_RE.match(dev.name):
            raise bad(f"invalid CDI device name {dev.name!r}", f"devices[{i}].name")
        if dev.name in seen:
            raise bad(f"duplicate CDI device name {dev.name!r}", f"devices[{i}].name")
        seen.add(dev.name)
        if dev.edits.empty() and spec.edits.empty():
            raise bad(f"device {dev.name!r} has empty container edits", f"devices[{i}].containerEdits")
    for e in [spec.edits, *(d.edits for d in spec.devices)]:
        for env in e.env:
            if "=" not in env or env.startswith("="):
                raise bad(f"invalid environment variable {env!r}", "containerEdits.env")
        for m in e.mounts:
            if not m.container_path.startswith("/") or not m.host_path.startswith("/"):
                raise bad(f"mount paths must be absolute: {m}", "containerEdits.mounts")
        for n in e.device_nodes:
            if not n.path.startswith("/"):
                raise bad(f"device node path must be absolute: {n.path}", "containerEdits.deviceNodes")


def spec_file_name(kind: Kind, claim_uid: str) -> str:
    """The claim's spec file name (``claim_uid`` passed the one UID rule where the kubelet's call
    came in, ``dra_kubeletplugin/claimbatch.py``)."""
    base = f"{kind.vendor}-{kind.cls}".replace("/", "_")
    return f"{base}_{claim_uid}.json"


def write_spec(path: Path, spec: Spec, claim_uid: str) -> Path:
    """Validate and atomically write the claim's spec to ``path`` (``render.NodeLayout.spec_path``,
    computed once when the prepare is planned and recorded with it; mode 0644: runtimes read it),
    refused unless it stays inside its directory (no symlink followed out of it)."""
    paths.contained(path, claim_uid=claim_uid)
    validate(spec, claim_uid=claim_uid)
    payload = (json.dumps(spec.to_json(), indent=2, sort_keys=True) + "\n").encode()
    files.write_atomic(path, payload, mode=0o644, dir_mode=0o755)
    return path


def remove_spec(path: Path) -> bool:
    """Remove a spec file; a missing file is fine (idempotent). Returns whether it existed.

    A missing file is checked first: on a read-only CDI directory ``unlink`` fails with EROFS
    even for a name that is not there, and an absent spec must not block a rollback.
    """
    if not os.path.lexists(path):
        return False
    return files.remove_nofollow(path)


def list_specs(cdi_dir: Path, kind: Kind) -> dict[str, Path]:
    """Claim UID -> spec file, for every spec of this driver's kind in ``cdi_dir``."""
    prefix = f"{kind.vendor}-{kind.cls}_"
    out: dict[str, Path] = {}
    try:
        entries = list(cdi_dir.iterdir())
    except FileNotFoundError:
        return out
    for p in entries:
        if p.name.startswith(prefix) and p.name.endswith(".json"):
            out[p.name[len(prefix) : -len(".json")]] = p
    return out


def host_paths(spec: Spec) -> tuple[str, ...]:
    """Every host path the spec names (device nodes and mount sources), in order, once each."""
    out: dict[str, None] = {}
    for e in (spec.edits, *(d.edits for d in spec.devices)):
        for n in e.device_nodes:
            out.setdefault(n.host_path or n.path, None)
        for m in e.mounts:
            out.setdefault(m.host_path, None)
    return tuple(out)


def host_path(device_root: Path, container_path: str) -> str:
    """Where a node path lives on the host, under the configured device root."""
    return str(device_root / container_path.lstrip("/"))


def whole_die_edits(device_nodes: Iterable[str], *, device_root: Path, env: Sequence[str] = ()) -> Edits:
    return Edits(
        env=tuple(env),
        device_nodes=tuple(DeviceNode(path=p, host_path=host_path(device_root, p)) for p in device_nodes),
    )


def shared_edits(
    shared_nodes: Iterable[str], driver_mounts: Iterable[str], *, device_root: Path, env: Mapping[str, str]
) -> Edits:
    """Spec-level edits applied once per container: shared device nodes and driver mounts."""
    return Edits(
        env=tuple(f"{k}={v}" for k, v in sorted(env.items())),
        device_nodes=tuple(DeviceNode(path=p, host_path=host_path(device_root, p)) for p in shared_nodes),
        mounts=tuple(Mount(host_path=host_path(device_root, p), container_path=p) for p in driver_mounts),
    )
