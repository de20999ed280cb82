"""Opaque VnpuConfig: strict decoding, precedence, and share quotas from consumedCapacity."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver import sharing
from dra_driver.devices import GIB, MIB
from dra_driver.errors import ErrorCode, InvalidInput

HDR = {"apiVersion": sharing.API_VERSION, "kind": sharing.KIND}


def test_defaults_and_overlay_order() -> None:
    cfg = sharing.resolve(
        [
            ("class[0]", {**HDR, "policy": "fixed", "transport": "tcp"}),
            ("claim[0]", {**HDR, "policy": "best-effort", "priority": "latency-critical"}),
        ],
        claim_uid="u",
    )
    assert cfg == sharing.VnpuConfig(
        policy=sharing.Policy.BEST_EFFORT,
        transport=sharing.Transport.TCP,
        priority=sharing.Priority.LATENCY_CRITICAL,
    )
    assert sharing.VnpuConfig().priority is sharing.Priority.NORMAL
    assert sharing.resolve([], claim_uid="u") == sharing.VnpuConfig()


@pytest.mark.parametrize(
    ("params", "field"),
    [
        pytest.param({**HDR, "polcy": "fixed"}, "cfg.polcy", id="unknown-field"),
        pytest.param({**HDR, "policy": 3}, "cfg.policy", id="wrong-type"),
        pytest.param({**HDR, "policy": "greedy"}, "cfg.policy", id="unknown-policy"),
        pytest.param({**HDR, "isolation": "none"}, "cfg.isolation", id="unknown-isolation"),
        pytest.param({**HDR, "priority": "urgent"}, "cfg.priority", id="unknown-priority"),
        pytest.param({**HDR, "priority": 1}, "cfg.priority", id="priority-wrong-type"),
        pytest.param({"kind": sharing.KIND}, "cfg.apiVersion", id="no-apiversion"),
        pytest.param({**HDR, "kind": "GpuConfig"}, "cfg.kind", id="wrong-kind"),
        pytest.param({**HDR, "hostMemory": "2.5Gi"}, "cfg.hostMemory", id="host-memory-fraction"),
        pytest.param({**HDR, "hostMemory": "lots"}, "cfg.hostMemory", id="host-memory-not-a-quantity"),
        pytest.param({**HDR, "hostMemory": "512Ki"}, "cfg.hostMemory", id="host-memory-below-1Mi"),
        pytest.param({**HDR, "hostMemory": "2Ti"}, "cfg.hostMemory", id="host-memory-over-1Ti"),
        pytest.param({**HDR, "hostMemory": True}, "cfg.hostMemory", id="host-memory-wrong-type"),
        pytest.param({**HDR, "hostMemory": ["1Gi"]}, "cfg.hostMemory", id="host-memory-list"),
    ],
)
def test_bad_opaque_config(params: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        sharing.resolve([("cfg", params)], claim_uid="uid-9")
    assert (info.value.code, info.value.field, info.value.claim_uid) == (
        ErrorCode.INVALID_OPAQUE_CONFIG,
        field,
        "uid-9",
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("2Gi", 2 * GIB, id="gib"),
        pytest.param("1536Mi", 1536 * MIB, id="mib"),
        pytest.param(str(GIB), GIB, id="plain-bytes-string"),
        pytest.param(GIB, GIB, id="plain-bytes-integer"),
        pytest.param("1G", 10**9, id="decimal"),
    ],
)
def test_host_memory(value: object, expected: int) -> None:
    cfg = sharing.resolve([("cfg", {**HDR, "hostMemory": value})], claim_uid="u")
    assert cfg.host_memory == expected
    assert sharing.resolve([], claim_uid="u").host_memory is None  # default: the memory quota


@pytest.mark.parametrize(
    ("host", "vnpus", "parts"),
    [
        pytest.param(None, 3, (0, 0, 0), id="unset-each-its-quota"),
        pytest.param(GIB, 1, (GIB,), id="one"),
        pytest.param(GIB + 1, 2, (GIB // 2 + 1, GIB // 2), id="remainder-to-the-first"),
    ],
)
def test_split_host_memory(host: int | None, vnpus: int, parts: tuple[int, ...]) -> None:
    assert sharing.split_host_memory(host, vnpus) == parts
    if host is not None:
        assert sum(parts) == host


@pytest.mark.parametrize(
    ("consumed", "expected"),
    [
        pytest.param({"memory": "128Mi", "compute": "10"}, (128 * MIB, 10), id="minimum"),
        pytest.param({"memory": "4Gi", "compute": "100"}, (4 * GIB, 100), id="gib"),
        pytest.param({"memory": str(256 * MIB), "compute": "1"}, (256 * MIB, 1), id="plain-bytes"),
    ],
)
def test_share_quota(consumed: dict[str, str], expected: tuple[int, int]) -> None:
    q = sharing.share_quota(consumed, die_memory_bytes=64 * GIB, claim_uid="u", field="f")
    assert (q.memory_bytes, q.compute_percent) == expected


@pytest.mark.parametrize(
    ("consumed", "field"),
    [
        pytest.param({"compute": "10"}, "f.memory", id="missing-memory"),
        pytest.param({"memory": "100Mi", "compute": "10"}, "f.memory", id="not-128mi-multiple"),
        pytest.param({"memory": "128Gi", "compute": "10"}, "f.memory", id="more-than-die"),
        pytest.param({"memory": "1.5Gi", "compute": "10"}, "f.memory", id="fraction"),
        pytest.param({"memory": "128Mi", "compute": "0"}, "f.compute", id="zero-compute"),
        pytest.param({"memory": "128Mi", "compute": "101"}, "f.compute", id="compute-over-100"),
        pytest.param({"memory": "128Mi"}, "f.compute", id="missing-compute"),
    ],
)
def test_bad_quota(consumed: dict[str, str], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        sharing.share_quota(consumed, die_memory_bytes=64 * GIB, claim_uid="u", field="f")
    assert (info.value.code, info.value.field) == (ErrorCode.QUOTA, field)
