"""Pure rules a registration must satisfy, checked against the dies and what is registered.

Decides whether a :class:`RegisterRequest` is new, a repeat of a registered claim, or refused
(with an error naming the claim and the field). No I/O, no logging.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dra_driver import paths
from dra_driver.daemon_api.values import RegisterRequest
from dra_driver.errors import ErrorCode, InvalidInput, StateError
from flexnpu_runtime.daemon.model import DieCapacity, Entity, parse_policy, parse_priority
from flexnpu_wire.codes import Policy
from flexnpu_wire.shares import MAX_HOST_MEMORY_BYTES

# Claim UIDs become file and directory names: the node's one rule (dra_driver/paths.py; no dots,
# so "<uid>.spec.json" parses back unambiguously and nothing can collide with ".ledger").
CLAIM_UID_RE = paths.UID_RE
TOKEN_RE = re.compile(r"^[0-9a-fA-F]{16,512}$")
MAX_SHARES = 64


@dataclass(frozen=True, slots=True)
class Decision:
    """``existing`` is the registered entity when the request repeats it exactly."""

    existing: Entity | None = None


def check_register(
    request: RegisterRequest, *, dies: Mapping[int, DieCapacity], entities: Iterable[Entity]
) -> Decision:
    """Validate ``request`` against the node's dies and every registered entity.

    Raises :class:`InvalidInput` for a malformed request (bad UID, token, unknown die, quota out
    of range) and :class:`StateError` when it conflicts with what is registered (same UID with a
    different request, die over-committed, another policy on the die).
    """
    uid = request.claim_uid
    _check_shape(request)
    others: list[Entity] = []
    for entity in entities:
        if entity.claim_uid == uid:
            if entity.request == request:
                return Decision(existing=entity)
            raise StateError(
                "already registered with a different request (shares, token, transport or name differ);"
                " unregister it first",
                code=ErrorCode.CLAIM_REPLACED,
                claim_uid=uid,
                field="claim_uid",
            )
        others.append(entity)
    _check_quotas(request, dies)
    _check_die_sharing(request, dies, others)
    return Decision()


def _check_shape(request: RegisterRequest) -> None:
    uid = request.claim_uid
    if not CLAIM_UID_RE.match(uid):
        raise InvalidInput(
            f"claim UID {uid!r} is empty, longer than 63 or has characters outside [A-Za-z0-9-]",
            claim_uid=uid or None,
            field="claim_uid",
        )
    if not TOKEN_RE.match(request.token):
        raise InvalidInput("token must be 16..512 hex digits", claim_uid=uid, field="token")
    if not request.shares:
        raise InvalidInput("at least one share is required", claim_uid=uid, field="shares")
    if len(request.shares) > MAX_SHARES:
        raise InvalidInput(f"at most {MAX_SHARES} shares per claim", claim_uid=uid, field="shares")
    seen: set[int] = set()
    for i, share in enumerate(request.shares):
        if share.virtual_id in seen:
            raise InvalidInput(
                f"virtual_id {share.virtual_id} is used twice",
                claim_uid=uid,
                field=f"shares[{i}].virtual_id",
            )
        seen.add(share.virtual_id)
        parse_policy(share.policy, claim_uid=uid, field_name=f"shares[{i}].policy")
        parse_priority(share.priority, claim_uid=uid, field_name=f"shares[{i}].priority")
    if seen != set(range(len(request.shares))):
        raise InvalidInput(
            f"virtual_id values must be 0..{len(request.shares) - 1}, got {sorted(seen)}",
            claim_uid=uid,
            field="shares.virtual_id",
        )


def _check_quotas(request: RegisterRequest, dies: Mapping[int, DieCapacity]) -> None:
    uid = request.claim_uid
    memory_per_die: dict[int, int] = defaultdict(int)
    for i, share in enumerate(request.shares):
        die = dies.get(share.die_phy_id)
        if die is None:
            known = ", ".join(str(p) for p in sorted(dies)) or "none"
            raise InvalidInput(
                f"die {share.die_phy_id} is not on this node (known dies: {known})",
                code=ErrorCode.DEVICE_NOT_FOUND,
                claim_uid=uid,
                field=f"shares[{i}].die_phy_id",
            )
        if not 0 < share.memory_bytes <= die.memory_bytes:
            raise InvalidInput(
                f"memory quota {share.memory_bytes} bytes must be > 0 and <= the die's"
                f" {die.memory_bytes} bytes (die {die.phy_id})",
                code=ErrorCode.QUOTA,
                claim_uid=uid,
                field=f"shares[{i}].memory_bytes",
            )
        if not 0 <= share.host_memory_bytes <= MAX_HOST_MEMORY_BYTES:
            raise InvalidInput(
                f"host memory limit {share.host_memory_bytes} bytes must be in 0..{MAX_HOST_MEMORY_BYTES}"
                " (0: the memory quota)",
                code=ErrorCode.QUOTA,
                claim_uid=uid,
                field=f"shares[{i}].host_memory_bytes",
            )
        low = 0 if share.memory_only else 1
        if not low <= share.compute_percent <= 100:
            raise InvalidInput(
                f"compute quota {share.compute_percent}% must be in {low}..100",
                code=ErrorCode.QUOTA,
                claim_uid=uid,
                field=f"shares[{i}].compute_percent",
            )
        memory_per_die[share.die_phy_id] += share.memory_bytes
    for phy_id, total in sorted(memory_per_die.items()):
        if total > dies[phy_id].memory_bytes:
            raise InvalidInput(
                f"shares on die {phy_id} ask for {total} bytes in total, more than its"
                f" {dies[phy_id].memory_bytes} bytes",
                code=ErrorCode.QUOTA,
                claim_uid=uid,
                field="shares.memory_bytes",
            )


def _check_die_sharing(
    request: RegisterRequest, dies: Mapping[int, DieCapacity], others: list[Entity]
) -> None:
    """One policy per die; memory (and fixed-policy compute) must fit beside the other claims."""
    uid = request.claim_uid
    policy_on_die: dict[int, tuple[Policy, str]] = {}
    used_memory: dict[int, int] = defaultdict(int)
    used_compute: dict[int, int] = defaultdict(int)
    for entity in sorted(others, key=lambda e: e.claim_uid):
        for share in entity.request.shares:
            policy = Policy(share.policy)
            policy_on_die.setdefault(share.die_phy_id, (policy, entity.claim_uid))
            used_memory[share.die_phy_id] += share.memory_bytes
            if not share.memory_only:
                used_compute[share.die_phy_id] += share.compute_percent
    mine: dict[int, Policy] = {}
    for i, share in enumerate(request.shares):
        phy_id = share.die_phy_id
        policy = Policy(share.policy)
        held = policy_on_die.get(phy_id)
        if held is not None and held[0] != policy:
            raise StateError(
                f"die {phy_id} already runs policy {held[0].value!r} (claim {held[1]});"
                f" this claim asks for {policy.value!r}; all vNPUs on a die use one policy",
                code=ErrorCode.POLICY_CONFLICT,
                claim_uid=uid,
                field=f"shares[{i}].policy",
            )
        if mine.setdefault(phy_id, policy) != policy:
            raise InvalidInput(
                f"shares on die {phy_id} ask for both {mine[phy_id].value!r} and {policy.value!r};"
                " all vNPUs on a die use one policy",
                code=ErrorCode.POLICY_CONFLICT,
                claim_uid=uid,
                field=f"shares[{i}].policy",
            )
    for phy_id in sorted(mine):
        shares = [s for s in request.shares if s.die_phy_id == phy_id]
        memory = used_memory[phy_id] + sum(s.memory_bytes for s in shares)
        if memory > dies[phy_id].memory_bytes:
            raise StateError(
                f"die {phy_id} has {dies[phy_id].memory_bytes - used_memory[phy_id]} bytes of memory left,"
                f" this claim asks for {memory - used_memory[phy_id]}",
                code=ErrorCode.DEVICE_BUSY,
                claim_uid=uid,
                field="shares.memory_bytes",
            )
        if mine[phy_id] is Policy.FIXED:
            own = sum(s.compute_percent for s in shares if not s.memory_only)
            if own > 100:
                raise InvalidInput(
                    f"fixed-policy shares on die {phy_id} ask for {own}% compute in total, more than 100%",
                    code=ErrorCode.QUOTA,
                    claim_uid=uid,
                    field="shares.compute_percent",
                )
            compute = used_compute[phy_id] + own
            if compute > 100:
                raise StateError(
                    f"die {phy_id} has {100 - used_compute[phy_id]}% fixed-policy compute left,"
                    f" this claim asks for {compute - used_compute[phy_id]}%",
                    code=ErrorCode.DEVICE_BUSY,
                    claim_uid=uid,
                    field="shares.compute_percent",
                )
