"""Opaque configuration of vNPU shares (``npu.flexnpu.io/v1alpha1`` ``VnpuConfig``): decode, merge, validate.

Pure. Accepted in a DeviceClass's and a claim's ``config[].opaque.parameters`` when
``opaque.driver`` is this driver (other drivers' configs are ignored, never an error)::

    apiVersion: npu.flexnpu.io/v1alpha1
    kind: VnpuConfig
    policy: elastic          # fixed | elastic | best-effort   (default: elastic)
    priority: normal         # latency-critical | normal | batch: when its work gets the die,
                             # never how much (docs/latency.md)   (default: normal)
    isolation: full          # full (memory + compute) | memory-only   (default: full)
    transport: auto          # auto (unix socket, TCP fallback) | unix | tcp   (default: auto)
    interposition: auto      # auto | preload | none: inject libascendcl.so (dra_driver/interposition.py)
    vnpus: 2                 # equal distribution: split this share into N vNPUs   (default: 1)
    hostMemory: 2Gi          # host memory (aclrtMallocHost, model bytes) its sessions may hold
                             # together (default: the share's memory quota)

``vnpus: N`` is FlexNPU's equal distribution: the claim asks for the total (one share request,
``memory: 256Mi, compute: "20"``) and the node divides it into N vNPUs of total/N each (devices
0..N-1 in the container), served by the claim's one aclserver. A total that does not divide into
whole 128 MiB steps and whole percents is refused (a ``memory-only`` share's compute, which caps
nothing, need not divide).

``hostMemory`` bounds host memory, which is not device memory: the pinned buffers
``aclrtMallocHost`` gives and the model bytes in flight while one loads, for every session of the
share together (1Mi .. 1Ti; with ``vnpus: N`` each vNPU holds hostMemory/N of it). It sizes the
claim's shm tmpfs. The default, the share's own memory quota, keeps what a claim could hold before
the field existed, and is what a program that mirrors each device buffer in host memory needs.

Precedence, per request: every class config, then every claim config, in order; a later
config overrides only the fields it sets. Decoding is strict: an unknown field, a wrong type
or an unknown value fails the prepare of that claim with a message naming the field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from dra_driver.devices import MIB
from dra_driver.errors import ErrorCode, InvalidInput, quote
from flexnpu_wire.codes import Policy, Priority
from flexnpu_wire.shares import MAX_HOST_MEMORY_BYTES

__all__ = [
    "API_VERSION",
    "KIND",
    "Interposition",
    "Isolation",
    "Policy",
    "Priority",
    "ShareQuota",
    "Transport",
    "VnpuConfig",
]

API_VERSION = "npu.flexnpu.io/v1alpha1"
KIND = "VnpuConfig"
MEMORY_STEP = 128 * MIB
MIN_HOST_MEMORY_BYTES = MIB
MAX_VNPUS = 16


class Isolation(StrEnum):
    FULL = "full"
    MEMORY_ONLY = "memory-only"


class Transport(StrEnum):
    AUTO = "auto"
    UNIX = "unix"
    TCP = "tcp"


class Interposition(StrEnum):
    AUTO = "auto"
    PRELOAD = "preload"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class VnpuConfig:
    policy: Policy = Policy.ELASTIC
    priority: Priority = Priority.NORMAL
    isolation: Isolation = Isolation.FULL
    transport: Transport = Transport.AUTO
    interposition: Interposition = Interposition.AUTO
    vnpus: int = 1
    host_memory: int | None = None
    """``hostMemory`` in bytes; None: the share's memory quota."""

    @property
    def memory_only(self) -> bool:
        return self.isolation == Isolation.MEMORY_ONLY


_ENUMS: dict[str, type[StrEnum]] = {
    "policy": Policy,
    "priority": Priority,
    "isolation": Isolation,
    "transport": Transport,
    "interposition": Interposition,
}


def decode(params: Mapping[str, Any], *, claim_uid: str, where: str) -> dict[str, StrEnum | int]:
    """Strictly decode one ``parameters`` object into the fields it sets."""

    def bad(msg: str, fld: str) -> InvalidInput:
        return InvalidInput(
            msg, code=ErrorCode.INVALID_OPAQUE_CONFIG, claim_uid=claim_uid, field=f"{where}.{fld}"
        )

    if params.get("apiVersion") != API_VERSION:
        raise bad(
            f"apiVersion must be {quote(API_VERSION)}, got {quote(params.get('apiVersion'))}", "apiVersion"
        )
    if params.get("kind") != KIND:
        raise bad(f"kind must be {quote(KIND)}, got {quote(params.get('kind'))}", "kind")
    out: dict[str, StrEnum | int] = {}
    for key, value in params.items():
        if key in ("apiVersion", "kind"):
            continue
        if key == "hostMemory":
            out["host_memory"] = _host_memory(value, bad=lambda msg: bad(msg, "hostMemory"))
            continue
        if key == "vnpus":
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad(f"must be a whole number, got {type(value).__name__}", key)
            if not 1 <= value <= MAX_VNPUS:
                raise bad(f"must be 1..{MAX_VNPUS}, got {value}", key)
            out[key] = value
            continue
        enum = _ENUMS.get(key)
        if enum is None:
            known = ", ".join(sorted([*_ENUMS, "vnpus", "hostMemory"]))
            raise bad(f"unknown field {quote(key)} (known: {known})", key)
        if not isinstance(value, str):
            raise bad(f"must be a string, got {type(value).__name__}", key)
        try:
            out[key] = enum(value)
        except ValueError:
            raise bad(
                f"unknown value {quote(value)}; use one of {', '.join(e.value for e in enum)}", key
            ) from None
    return out


def _host_memory(value: object, *, bad: Callable[[str], InvalidInput]) -> int:
    """``hostMemory``: a quantity (``2Gi``, ``512Mi``, ``1073741824``) of 1Mi .. 1Ti."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise bad(f'must be a quantity such as "2Gi", got {type(value).__name__}')
    try:
        number = parse_quantity(str(value), claim_uid="", field="")
    except InvalidInput:
        raise bad(f"{quote(value)} is not a whole quantity (such as 2Gi or 512Mi)") from None
    if not MIN_HOST_MEMORY_BYTES <= number <= MAX_HOST_MEMORY_BYTES:
        raise bad(f"must be 1Mi..1Ti, got {quote(value)}")
    return number


def resolve(
    configs: Iterable[tuple[str, Mapping[str, Any]]], *, claim_uid: str, base: VnpuConfig | None = None
) -> VnpuConfig:
    """Overlay ``(where, parameters)`` pairs (already in precedence order) on the defaults."""
    cfg = base or VnpuConfig()
    for where, params in configs:
        cfg = replace(cfg, **decode(params, claim_uid=claim_uid, where=where))  # type: ignore[arg-type]
    return cfg


def parse_quantity(value: str, *, claim_uid: str, field: str) -> int:
    """A Kubernetes quantity as an integer (binary and decimal suffixes; no fractions)."""
    suffixes = {
        "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5, "Ei": 1024**6,
        "k": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4, "P": 1000**5, "E": 1000**6,
    }  # fmt: skip
    text = str(value).strip()
    for suffix in sorted(suffixes, key=len, reverse=True):
        if text.endswith(suffix):
            number, mult = text[: -len(suffix)], suffixes[suffix]
            break
    else:
        number, mult = text, 1
    if not number.isdigit():
        raise InvalidInput(
            f"{quote(value)} is not a whole quantity", code=ErrorCode.QUOTA, claim_uid=claim_uid, field=field
        )
    return int(number) * mult


@dataclass(frozen=True, slots=True)
class ShareQuota:
    memory_bytes: int
    compute_percent: int


def share_quota(
    consumed: Mapping[str, str], *, die_memory_bytes: int, claim_uid: str, field: str
) -> ShareQuota:
    """Quotas of one share from the allocation's ``consumedCapacity`` (the source of truth)."""
    if "memory" not in consumed:
        raise InvalidInput(
            "the allocation has no consumedCapacity.memory for this share",
            code=ErrorCode.QUOTA, claim_uid=claim_uid, field=f"{field}.memory",
        )  # fmt: skip
    memory = parse_quantity(consumed["memory"], claim_uid=claim_uid, field=f"{field}.memory")
    if memory <= 0 or memory % MEMORY_STEP:
        raise InvalidInput(
            f"memory {quote(consumed['memory'])} is not a positive multiple of 128Mi",
            code=ErrorCode.QUOTA, claim_uid=claim_uid, field=f"{field}.memory",
        )  # fmt: skip
    if memory > die_memory_bytes:
        raise InvalidInput(
            f"memory {quote(consumed['memory'])} is more than the die has ({die_memory_bytes} bytes)",
            code=ErrorCode.QUOTA, claim_uid=claim_uid, field=f"{field}.memory",
        )  # fmt: skip
    compute = parse_quantity(consumed.get("compute", "0"), claim_uid=claim_uid, field=f"{field}.compute")
    if not 1 <= compute <= 100:
        raise InvalidInput(
            f"compute {quote(consumed.get('compute'))} must be 1..100 percent",
            code=ErrorCode.QUOTA, claim_uid=claim_uid, field=f"{field}.compute",
        )  # fmt: skip
    return ShareQuota(memory_bytes=memory, compute_percent=compute)


def split(
    quota: ShareQuota, vnpus: int, *, memory_only: bool = False, claim_uid: str, field: str
) -> ShareQuota:
    """The quota of each of ``vnpus`` equal vNPUs of ``quota`` (whole 128 MiB steps, whole percents).

    A ``memory-only`` share has no compute cap, so its compute need not divide: each vNPU gets
    the whole-percent part of its N-th (possibly 0, which such a share accepts).
    """
    if quota.memory_bytes % (vnpus * MEMORY_STEP):
        raise InvalidInput(
            f"memory {quota.memory_bytes // MIB}Mi does not divide into {vnpus} vNPUs of whole 128Mi steps",
            code=ErrorCode.QUOTA, claim_uid=claim_uid, field=f"{field}.memory",
        )  # fmt: skip
    if quota.compute_percent % vnpus and not memory_only:
        raise InvalidInput(
            f"compute {quota.compute_percent}% does not divide into {vnpus} vNPUs of whole percents",
            code=ErrorCode.QUOTA, claim_uid=claim_uid, field=f"{field}.compute",
        )  # fmt: skip
    return ShareQuota(
        memory_bytes=quota.memory_bytes // vnpus, compute_percent=quota.compute_percent // vnpus
    )


def split_host_memory(host_memory: int | None, vnpus: int) -> tuple[int, ...]:
    """Each vNPU's part of ``hostMemory`` (0 each when unset: the default is their memory quota);
    the first takes the remainder, so the parts add up to the whole."""
    if host_memory is None:
        return (0,) * vnpus
    part = host_memory // vnpus
    return (host_memory - part * (vnpus - 1), *([part] * (vnpus - 1)))


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One of this driver's opaque config entries of a claim (``config[index]``), its shape checked."""

    index: int
    source: str
    requests: tuple[str, ...]
    parameters: Mapping[str, Any]


def driver_configs(raw: Any, *, driver_name: str, field: str, claim_uid: str = "") -> list[ConfigEntry]:
    """This driver's entries of the claim's ``config`` list at ``field`` (other drivers' entries are
    not ours to judge). Pure; raises InvalidInput (InvalidOpaqueConfig) naming the entry's field."""
    uid = claim_uid or None
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidInput(
            f"config must be a list, got {type(raw).__name__}",
            code=ErrorCode.INVALID_OPAQUE_CONFIG,
            claim_uid=uid,
            field=field,
        )
    out: list[ConfigEntry] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise InvalidInput(
                "config entry is not an object",
                code=ErrorCode.INVALID_OPAQUE_CONFIG,
                claim_uid=uid,
                field=f"{field}[{i}]",
            )
        opaque = entry.get("opaque")
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver_name:
            continue
        params = opaque.get("parameters")
        if not isinstance(params, Mapping):
            raise InvalidInput(
                f"parameters must be a VnpuConfig object, got {quote(params)}",
                code=ErrorCode.INVALID_OPAQUE_CONFIG,
                claim_uid=uid,
                field=f"{field}[{i}].opaque.parameters",
            )
        requests = entry.get("requests") or []
        if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
            raise InvalidInput(
                f"requests must be a list of request names, got {quote(requests)}",
                code=ErrorCode.INVALID_OPAQUE_CONFIG,
                claim_uid=uid,
                field=f"{field}[{i}].requests",
            )
        out.append(ConfigEntry(i, str(entry.get("source") or "FromClaim"), tuple(requests), params))
    return out
