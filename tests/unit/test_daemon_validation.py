"""Registration rules of the daemon (pure): shape, quotas, die sharing, duplicates."""

from __future__ import annotations

import dataclasses

import pytest

from dra_driver.daemon_api.values import Endpoints, EntityState, RegisterRequest
from dra_driver.errors import ErrorCode, InvalidInput, StateError
from flexnpu_runtime.daemon import registration_rules
from flexnpu_runtime.daemon.model import DieCapacity, Entity
from flexnpu_wire.shares import Share

GIB = 1024**3
DIES = {0: DieCapacity(0, 32 * GIB), 3: DieCapacity(3, 64 * GIB)}
TOKEN = "0f" * 16


def share(
    die: int = 3, *, vid: int = 0, mem: int = GIB, compute: int = 30, policy: str = "fixed", **kw: bool | str
) -> Share:
    return Share(vid, die, mem, compute, policy, **kw)


def req(uid: str = "claim-a", *shares: Share, token: str = TOKEN) -> RegisterRequest:
    return RegisterRequest(uid, "ns", "name", token, shares or (share(),))


def registered(request: RegisterRequest) -> Entity:
    return Entity(request=request, state=EntityState.RUNNING, endpoints=Endpoints(), pid=42, pid_start_time=1)


OTHER_FIXED_60 = registered(req("claim-b", share(3, compute=60, mem=40 * GIB)))
OTHER_ELASTIC = registered(req("claim-c", share(3, policy="elastic", compute=90)))


@pytest.mark.parametrize(
    ("request_", "others", "error", "code", "field"),
    [
        pytest.param(
            req("", share()), [], InvalidInput, ErrorCode.INVALID_ARGUMENT, "claim_uid", id="empty-uid"
        ),
        pytest.param(req("../etc"), [], InvalidInput, ErrorCode.INVALID_ARGUMENT, "claim_uid", id="path-uid"),
        pytest.param(req(token="xyz"), [], InvalidInput, ErrorCode.INVALID_ARGUMENT, "token", id="bad-token"),
        pytest.param(
            RegisterRequest("claim-a", "ns", "n", TOKEN, ()),
            [],
            InvalidInput,
            ErrorCode.INVALID_ARGUMENT,
            "shares",
            id="no-shares",
        ),
        pytest.param(
            req("claim-a", share(9)),
            [],
            InvalidInput,
            ErrorCode.DEVICE_NOT_FOUND,
            "shares[0].die_phy_id",
            id="unknown-die",
        ),
        pytest.param(
            req("claim-a", share(mem=0)),
            [],
            InvalidInput,
            ErrorCode.QUOTA,
            "shares[0].memory_bytes",
            id="memory-0",
        ),
        pytest.param(
            req("claim-a", share(0, mem=33 * GIB)),
            [],
            InvalidInput,
            ErrorCode.QUOTA,
            "shares[0].memory_bytes",
            id="memory-over-die",
        ),
        pytest.param(
            req("claim-a", share(compute=0)),
            [],
            InvalidInput,
            ErrorCode.QUOTA,
            "shares[0].compute_percent",
            id="compute-0",
        ),
        pytest.param(
            req("claim-a", share(compute=101)),
            [],
            InvalidInput,
            ErrorCode.QUOTA,
            "shares[0].compute_percent",
            id="compute-101",
        ),
        pytest.param(
            req("claim-a", share(policy="greedy")),
            [],
            InvalidInput,
            ErrorCode.INVALID_ARGUMENT,
            "shares[0].policy",
            id="unknown-policy",
        ),
        pytest.param(
            req("claim-a", share(priority="urgent")),
            [],
            InvalidInput,
            ErrorCode.INVALID_ARGUMENT,
            "shares[0].priority",
            id="unknown-priority",
        ),
        pytest.param(
            req("claim-a", share(vid=0), share(vid=0)),
            [],
            InvalidInput,
            ErrorCode.INVALID_ARGUMENT,
            "shares[1].virtual_id",
            id="duplicate-virtual-id",
        ),
        pytest.param(
            req("claim-a", share(vid=1)),
            [],
            InvalidInput,
            ErrorCode.INVALID_ARGUMENT,
            "shares.virtual_id",
            id="virtual-ids-not-from-0",
        ),
        pytest.param(
            req("claim-a", share(vid=0, compute=60), share(vid=1, compute=60)),
            [],
            InvalidInput,
            ErrorCode.QUOTA,
            "shares.compute_percent",
            id="own-fixed-compute-over-100",
        ),
        pytest.param(
            req("claim-a", share(vid=0, mem=20 * GIB, die=0), share(vid=1, mem=20 * GIB, die=0)),
            [],
            InvalidInput,
            ErrorCode.QUOTA,
            "shares.memory_bytes",
            id="own-memory-over-die",
        ),
        pytest.param(
            req("claim-a", share(vid=0, policy="fixed"), share(vid=1, policy="elastic")),
            [],
            InvalidInput,
            ErrorCode.POLICY_CONFLICT,
            "shares[1].policy",
            id="own-policy-mix",
        ),
        pytest.param(
            req("claim-a", share(policy="elastic")),
            [OTHER_FIXED_60],
            StateError,
            ErrorCode.POLICY_CONFLICT,
            "shares[0].policy",
            id="policy-conflict",
        ),
        pytest.param(
            req("claim-a", share(compute=41)),
            [OTHER_FIXED_60],
            StateError,
            ErrorCode.DEVICE_BUSY,
            "shares.compute_percent",
            id="fixed-compute-over-commit",
        ),
        pytest.param(
            req("claim-a", share(mem=25 * GIB)),
            [OTHER_FIXED_60],
            StateError,
            ErrorCode.DEVICE_BUSY,
            "shares.memory_bytes",
            id="memory-over-commit",
        ),
        pytest.param(
            req("claim-b", share(compute=10)),
            [OTHER_FIXED_60],
            StateError,
            ErrorCode.CLAIM_REPLACED,
            "claim_uid",
            id="same-uid-different-request",
        ),
    ],
)
def test_refused(
    request_: RegisterRequest, others: list[Entity], error: type[Exception], code: ErrorCode, field: str
) -> None:
    with pytest.raises(error) as info:
        registration_rules.check_register(request_, dies=DIES, entities=others)
    err = info.value
    assert isinstance(err, InvalidInput | StateError)
    assert (err.code, err.field) == (code, field)
    if request_.claim_uid:
        assert request_.claim_uid in str(err)


@pytest.mark.parametrize(
    ("request_", "others"),
    [
        pytest.param(req("claim-a", share(compute=40)), [OTHER_FIXED_60], id="fixed-fits-exactly"),
        pytest.param(
            req("claim-a", share(policy="elastic", compute=90)), [OTHER_ELASTIC], id="elastic-may-exceed-100"
        ),
        pytest.param(
            req("claim-a", share(0, policy="elastic")), [OTHER_FIXED_60], id="other-die-other-policy"
        ),
        pytest.param(req("claim-a", share(compute=0, memory_only=True)), [], id="memory-only-compute-0"),
        pytest.param(req("claim-a", share(mem=64 * GIB, compute=100)), [], id="whole-die-quota"),
    ],
)
def test_accepted_as_new(request_: RegisterRequest, others: list[Entity]) -> None:
    assert registration_rules.check_register(request_, dies=DIES, entities=others).existing is None


def test_identical_request_returns_existing_entity() -> None:
    entity = registered(req("claim-a"))
    decision = registration_rules.check_register(
        dataclasses.replace(entity.request), dies=DIES, entities=[entity]
    )
    assert decision.existing is entity


def test_policy_conflict_names_die_and_both_policies() -> None:
    with pytest.raises(StateError) as info:
        registration_rules.check_register(
            req("claim-a", share(policy="best-effort")), dies=DIES, entities=[OTHER_FIXED_60]
        )
    text = str(info.value)
    assert "die 3" in text and "'fixed'" in text and "'best-effort'" in text and "claim-b" in text
