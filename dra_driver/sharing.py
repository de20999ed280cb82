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

``hostMemory`` is bounded by the node, not by the tenant (:class:`HostMemoryBound`, the flags
``--host-memory-ratio`` and ``--max-host-memory`` of the plugin and the webhook): a request may ask
for at most ``ratio`` times its share's device memory, and never more than the cap; its own device
memory (the default) is always allowed. A DeviceClass's ``hostMemory`` is a ceiling too: a claim's
config may ask for less than its class gives, never more. The webhook and prepare both refuse a
claim over the bound, naming the claim and the config entry's field (``docs/tenant-bounds.md``).

Precedence, per request: every class config, then every claim config, in order; a later
config overrides only the fields it sets. Decoding is strict: an unknown field, a wrong type
or an unknown value fails the prepare of that claim with a message naming the field.

Planning's share stage is here too (``dra_driver/plan.py`` calls it once): :func:`plan_shares`
gives every soft-split device of a claim its shares (quota from the allocation, virtual IDs in
device order) and its resolved config, over the policy of the share device the scheduler chose
(``vnpu-<phy>`` elastic, ``vnpu-<phy>-fixed``, ``vnpu-<phy>-best-effort``: ``dra_driver/slices.py``),
and returns, without raising it, what a new prepare must refuse: a config naming another policy
than its device serves (:func:`check_device_policies`), then a ``hostMemory`` over the node's bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from dra_driver import slices
from dra_driver.devices import GIB, MIB, AllocatedDevice, DieMode
from dra_driver.errors import ErrorCode, InvalidInput, quote
from flexnpu_wire.codes import Policy, Priority
from flexnpu_wire.shares import MAX_HOST_MEMORY_BYTES, Share

__all__ = [
    "API_VERSION",
    "KIND",
    "HostMemoryBound",
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
DEFAULT_HOST_MEMORY_RATIO = 2.0
MAX_HOST_MEMORY_RATIO = 64.0
DEFAULT_MAX_HOST_MEMORY = 64 * GIB


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


@dataclass(frozen=True, slots=True)
class HostMemoryBound:
    """The most host memory (``hostMemory``) a share request may ask for, set by the node's admin.

    :meth:`limit`: ``ratio`` times the request's device memory, at most ``cap_bytes``, and never
    less than the device memory itself (the default every claim gets without asking). So a node's
    shares together hold at most ``ratio`` times the device memory it publishes in host memory.
    """

    ratio: float = DEFAULT_HOST_MEMORY_RATIO
    cap_bytes: int = DEFAULT_MAX_HOST_MEMORY

    def limit(self, memory_bytes: int) -> int:
        return max(memory_bytes, min(int(memory_bytes * self.ratio), self.cap_bytes))

    def describe(self, memory_bytes: int) -> str:
        return (
            f"{_mib(self.limit(memory_bytes))} for a share of {_mib(memory_bytes)}"
            f" (the node allows {self.ratio:g}x the share's device memory, at most {_mib(self.cap_bytes)})"
        )


def _mib(number: int) -> str:
    return f"{number // MIB}Mi" if number % MIB == 0 else f"{number} bytes"


def check_host_memory(
    configs: Iterable[tuple[str, str, Mapping[str, Any]]],
    *,
    memory_bytes: int,
    bound: HostMemoryBound,
    claim_uid: str,
    who: str,
) -> None:
    """Refuse a ``hostMemory`` over the node's bound or over its DeviceClass's value.

    ``configs``: ``(source, where, parameters)`` of one request in precedence order (class configs
    first, ``source`` ``"FromClass"`` or ``"FromClaim"``), already decoded once. ``memory_bytes``:
    the request's device memory (all its vNPUs together). Pure; raises InvalidInput naming the
    field of the config entry that asked for too much.
    """
    ceiling: tuple[int, str] | None = None
    for source, where, params in configs:
        if "hostMemory" not in params:
            continue
        asked = _host_memory(params["hostMemory"], bad=InvalidInput)
        fld = f"{where}.hostMemory"
        if asked > bound.limit(memory_bytes):
            raise InvalidInput(
                f"{who} asks for {quote(params['hostMemory'])} of host memory; the most is"
                f" {bound.describe(memory_bytes)}: ask for less, or for more device memory",
                code=ErrorCode.INVALID_OPAQUE_CONFIG,
                claim_uid=claim_uid or None,
                field=fld,
            )
        if source == "FromClass":
            ceiling = (asked if ceiling is None else min(ceiling[0], asked), where)
        elif ceiling is not None and asked > ceiling[0]:
            raise InvalidInput(
                f"{who} asks for {quote(params['hostMemory'])} of host memory, more than its DeviceClass's"
                f" {_mib(ceiling[0])} ({ceiling[1]}.hostMemory): a claim may ask for less than its class, never more",
                code=ErrorCode.INVALID_OPAQUE_CONFIG,
                claim_uid=claim_uid or None,
                field=fld,
            )


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
    source: str  # "FromClass" | "FromClaim"
    requests: tuple[str, ...]  # empty = all requests
    parameters: Mapping[str, Any]

    def applies_to(self, request: str) -> bool:
        top = request.split("/", 1)[0]
        return not self.requests or request in self.requests or top in self.requests


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


def configs_for(configs: Iterable[ConfigEntry], request: str) -> list[ConfigEntry]:
    """The entries that apply to ``request``: class configs first, then claim configs, each in
    order (later entries win)."""
    return sorted(
        (c for c in configs if c.applies_to(request)),
        key=lambda c: (0 if c.source == "FromClass" else 1, c.index),
    )


@dataclass(frozen=True, slots=True)
class SharedDevice:
    """A soft-split device's shares (one, or N with ``vnpus: N``) and its resolved config."""

    shares: tuple[Share, ...]
    config: VnpuConfig


@dataclass(frozen=True, slots=True)
class SharePlan:
    """What :func:`plan_shares` decides: per device (in order) its shares, None for a device that is
    not soft-split; and what a new prepare must refuse (None: nothing)."""

    devices: tuple[SharedDevice | None, ...]
    refused_new: Exception | None = None


def plan_shares(
    devices: Sequence[AllocatedDevice],
    configs: Sequence[ConfigEntry],
    *,
    claim_uid: str,
    claim: str,
    bound: HostMemoryBound = HostMemoryBound(),
) -> SharePlan:
    """Every soft device's shares and resolved config, in one pass over the claim's devices; raises
    InvalidInput naming the field for a quota or config that cannot be read. The refusal a new
    prepare gets (a claim prepared before keeps what it was prepared with) is returned: a config
    that names another policy than its device serves first, then a ``hostMemory`` over ``bound``
    (``claim``, "namespace/name", names the claim in that error)."""
    out: list[SharedDevice | None] = []
    vid = 0
    for d in devices:
        if d.mode != DieMode.SOFT:
            out.append(None)
            continue
        fld = f"status.allocation.devices.results[{d.request}/{d.device}].consumedCapacity"
        params = [
            (f"status.allocation.devices.config[{c.index}].opaque.parameters", c.parameters)
            for c in configs_for(configs, d.request)
        ]
        quota = share_quota(
            d.consumed_capacity, die_memory_bytes=d.die.memory_bytes, claim_uid=claim_uid, field=fld
        )
        cfg = resolve(params, claim_uid=claim_uid, base=VnpuConfig(policy=d.device_policy))
        each = (
            split(quota, cfg.vnpus, memory_only=cfg.memory_only, claim_uid=claim_uid, field=fld)
            if cfg.vnpus > 1
            else quota
        )
        host = split_host_memory(cfg.host_memory, cfg.vnpus)
        shares = tuple(
            Share(
                virtual_id=vid + i,
                die_phy_id=d.die.phy_id,
                memory_bytes=each.memory_bytes,
                compute_percent=each.compute_percent,
                policy=str(cfg.policy),
                memory_only=cfg.memory_only,
                host_memory_bytes=host[i],
                priority=str(cfg.priority),
            )
            for i in range(cfg.vnpus)
        )
        out.append(SharedDevice(shares, cfg))
        vid += cfg.vnpus
    try:
        check_device_policies(devices, out, configs, claim_uid=claim_uid)
        for d, shared in zip(devices, out, strict=True):
            if shared is None or shared.config.host_memory is None:
                continue
            check_host_memory(
                [
                    (c.source, f"status.allocation.devices.config[{c.index}].opaque.parameters", c.parameters)
                    for c in configs_for(configs, d.request)
                ],
                memory_bytes=sum(s.memory_bytes for s in shared.shares),
                bound=bound,
                claim_uid=claim_uid,
                who=f"claim {claim} (request {d.request}, device {d.device})",
            )
    except Exception as refused:
        return SharePlan(tuple(out), refused_new=refused)
    return SharePlan(tuple(out))


def check_device_policies(
    devices: Sequence[AllocatedDevice],
    shared: Sequence[SharedDevice | None],
    configs: Sequence[ConfigEntry],
    *,
    claim_uid: str,
) -> None:
    """Refuse a share whose config names another policy than the share device the scheduler chose
    serves (the scheduler keeps one policy per die only through the device). Checked for a new
    prepare; a claim prepared before share devices had a policy keeps what it was prepared with."""
    for d, s in zip(devices, shared, strict=True):
        if s is None or s.config.policy == d.device_policy:
            continue
        setters = [c for c in configs_for(configs, d.request) if "policy" in c.parameters]
        at = setters[-1].index if setters else 0
        want = s.config.policy
        raise InvalidInput(
            f"policy {quote(str(want))} does not agree with the share device {quote(d.device)} the scheduler chose,"
            f" which serves {quote(str(d.device_policy))} shares: ask for {quote(str(want))} share devices"
            f" (the chart's DeviceClass {_CLASS_OF[want]}: devices whose attribute mode is"
            f" {quote(slices.share_mode(want))}), so that the scheduler places the share on a die without another policy",
            code=ErrorCode.INVALID_OPAQUE_CONFIG,
            claim_uid=claim_uid,
            field=f"status.allocation.devices.config[{at}].opaque.parameters.policy",
        )


_CLASS_OF = {
    Policy.ELASTIC: "vnpu.flexnpu.io",
    Policy.FIXED: "vnpu-fixed.flexnpu.io",
    Policy.BEST_EFFORT: "vnpu-best-effort.flexnpu.io",
}
