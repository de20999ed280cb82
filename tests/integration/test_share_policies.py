"""Every placement conflict decided by the scheduler: one compute policy per die, seen in the pool.

Through the scheduler stand-in (it honours device taints and charges counters as the v1.36
allocator does), the real node process, daemon and aclservers. A die has one share device per
policy; once the node prepared a share on a die, the die's share devices of the other policies
carry a NoSchedule taint, so an elastic share is placed on a die without a fixed one, and a share
pinned to that die stays Pending until the fixed one is gone. The policy is the share device's
(the DeviceClass picks it); an opaque ``policy`` that disagrees is a clear error at prepare. The
node's ``PolicyConflict`` check stays as a guard (for an allocation made before the taint landed),
counted in ``flexnpu_dra_prepare_requests_total{error_type="PolicyConflict"}``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kubernetes
import pytest

from dra_driver import wirefiles
from dra_driver.sharing import API_VERSION
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_testing.scheduler import Unschedulable
from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import DRIVER, NAMESPACE, NODE, Node
from tests.integration.lifecycle_helpers import claim_doc, conf_path, pod_ref
from tests.integration.test_usage_metrics import _free_port, scrape


def _share(cls: str, *, die: int | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {
        "deviceClassName": cls,
        "capacity": {"requests": {"memory": "256Mi", "compute": "10"}},
    }
    if die is not None:
        exactly["selectors"] = [{"cel": {"expression": f'device.attributes["{DRIVER}"].phyID == {die}'}}]
    return {"name": "vnpu", "exactly": exactly}


def _policy(policy: str) -> list[dict[str, Any]]:
    return [
        {
            "opaque": {
                "driver": DRIVER,
                "parameters": {"apiVersion": API_VERSION, "kind": "VnpuConfig", "policy": policy},
            }
        }
    ]


@pytest.fixture
def node(node_factory: Callable[..., Node]) -> tuple[Node, int]:
    port = _free_port()
    n = node_factory(daemon=True, FLEXNPU_DEFAULT_MODE="both", FLEXNPU_METRICS_PORT=str(port)).start()
    wait_for(n.devices, what="published devices")
    return n, port


def _claim(
    n: Node, name: str, request: dict[str, Any], config: list[dict[str, Any]] | None = None
) -> ClaimRef:
    return ClaimRef(NAMESPACE, n.create_claim(name, [request], config), name)


def _allocated(n: Node, ref: ClaimRef) -> str:
    claim = n.scheduler.allocate(NAMESPACE, ref.name, NODE, reserved_for=[pod_ref(f"pod-{ref.name}")])
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    device: str = result["device"]
    return device


def _taints(n: Node, device: str) -> list[dict[str, Any]]:
    (found,) = [d for d in n.devices() if d["name"] == device] or [{}]
    taints: list[dict[str, Any]] = found.get("taints") or []
    return taints


def _offers_only(n: Node, die: int, policy: str) -> None:
    """Wait until the published pool offers new shares on ``die`` only of ``policy``."""
    names = {"elastic": f"vnpu-{die}", "fixed": f"vnpu-{die}-fixed", "best-effort": f"vnpu-{die}-best-effort"}
    others = [name for p, name in names.items() if p != policy]

    def tainted() -> bool:
        return not _taints(n, names[policy]) and all(
            [t["key"] for t in _taints(n, d)] == ["npu.flexnpu.io/share-policy"] for d in others
        )

    wait_for(tainted, timeout=30, what=f"die {die}'s other share devices tainted")


def _prepared_policy(n: Node, ref: ClaimRef) -> str:
    assert n.kubelet is not None
    res = n.kubelet.prepare([ref])[ref.uid]
    assert res.error == "", res.error
    (share,) = wirefiles.load_client_conf(conf_path(n, ref.uid)).shares
    return str(share.policy)


def test_an_elastic_share_is_placed_on_a_die_without_a_fixed_one(node: tuple[Node, int]) -> None:
    n, _ = node
    fixed = _claim(n, "fixed", _share("vnpu-fixed.flexnpu.io"))
    fixed_device = _allocated(n, fixed)
    die = int(fixed_device.split("-")[1])
    assert fixed_device == f"vnpu-{die}-fixed" and _prepared_policy(n, fixed) == "fixed"
    _offers_only(n, die, "fixed")
    assert _taints(n, f"vnpu-{die}")[0]["value"] == "fixed" and not _taints(n, fixed_device)
    elastic = _claim(n, "elastic", _share("vnpu.flexnpu.io"))
    device = _allocated(n, elastic)
    assert device.startswith("vnpu-") and int(device.split("-")[1]) != die  # the scheduler chose another die
    assert _prepared_policy(n, elastic) == "elastic"  # and the node agrees: no PolicyConflict
    _offers_only(n, int(device.split("-")[1]), "elastic")
    # more fixed shares join the fixed die; a best-effort one goes elsewhere too
    second = _claim(n, "fixed-2", _share("vnpu-fixed.flexnpu.io"))
    assert _allocated(n, second) == fixed_device and _prepared_policy(n, second) == "fixed"
    best = _claim(n, "best", _share("vnpu-best-effort.flexnpu.io"))
    assert int(_allocated(n, best).split("-")[1]) not in (die, int(device.split("-")[1]))
    assert _prepared_policy(n, best) == "best-effort"


def test_a_share_pinned_to_a_fixed_die_waits_until_the_fixed_share_is_gone(node: tuple[Node, int]) -> None:
    n, _ = node
    assert n.kubelet is not None
    fixed = _claim(n, "fixed", _share("vnpu-fixed.flexnpu.io"))
    die = int(_allocated(n, fixed).split("-")[1])
    assert _prepared_policy(n, fixed) == "fixed"
    _offers_only(n, die, "fixed")
    pinned = _claim(n, "pinned", _share("vnpu.flexnpu.io", die=die))
    with pytest.raises(Unschedulable):
        n.scheduler.allocate(NAMESPACE, pinned.name, NODE)  # Pending, not a failed prepare
    assert n.kubelet.unprepare([fixed]) == {fixed.uid: ""}
    n.scheduler.deallocate(NAMESPACE, fixed.name)
    wait_for(lambda: not _taints(n, f"vnpu-{die}"), timeout=30, what="the die offered whole again")
    assert _allocated(n, pinned) == f"vnpu-{die}" and _prepared_policy(n, pinned) == "elastic"


def test_an_opaque_policy_must_agree_with_the_share_device(node: tuple[Node, int]) -> None:
    n, _ = node
    assert n.kubelet is not None
    wrong = _claim(n, "wrong", _share("vnpu.flexnpu.io"), _policy("fixed"))
    device = _allocated(n, wrong)
    err = n.kubelet.prepare([wrong])[wrong.uid].error
    assert "InvalidOpaqueConfig" in err and wrong.uid in err and "opaque.parameters.policy" in err, err
    assert device in err and "vnpu-fixed.flexnpu.io" in err
    (status,) = claim_doc(n, "wrong")["status"]["devices"]
    assert status["conditions"][0]["reason"] == "InvalidOpaqueConfig"
    restated = _claim(n, "restated", _share("vnpu-fixed.flexnpu.io"), _policy("fixed"))
    _allocated(n, restated)
    assert _prepared_policy(n, restated) == "fixed"


def test_the_policy_conflict_guard_stays_and_is_counted(node: tuple[Node, int]) -> None:
    n, port = node
    assert n.kubelet is not None
    fixed = _claim(n, "fixed", _share("vnpu-fixed.flexnpu.io"))
    fixed_device = _allocated(n, fixed)
    assert _prepared_policy(n, fixed) == "fixed"
    # an allocation the scheduler would never make (a pool published without counters could):
    # the elastic device of the same die
    other = _claim(n, "other", _share("vnpu.flexnpu.io"))
    doc = claim_doc(n, "other")
    (result,) = claim_doc(n, "fixed")["status"]["allocation"]["devices"]["results"]
    forged = {
        **result,
        "request": "vnpu",
        "device": fixed_device.removesuffix("-fixed"),
        "shareID": "5a4e0000-0000-4000-8000-00000000beef",
    }
    doc["status"] = {
        "allocation": {
            "devices": {"results": [forged]},
            "nodeSelector": claim_doc(n, "fixed")["status"]["allocation"]["nodeSelector"],
        },
        "reservedFor": [pod_ref("pod-other")],
    }
    model = kubernetes.client.ResourceV1ResourceClaim.from_dict(doc)
    n.resource.replace_namespaced_resource_claim_status("other", NAMESPACE, model)
    err = n.kubelet.prepare([other])[other.uid].error
    assert "PolicyConflict" in err and other.uid in err, err

    def counted() -> float | None:
        s = scrape(port)
        try:
            return s.value("flexnpu_dra_prepare_requests_total", result="error", error_type="PolicyConflict")
        except AssertionError:
            return None

    assert wait_for(counted, what="the guard counted") == 1
