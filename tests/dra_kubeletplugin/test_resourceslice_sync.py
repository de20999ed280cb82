"""The pure half of the ResourceSlice controller: matching, change detection, generations, dropped fields, pools."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from dra_kubeletplugin.resourceslice import sync
from dra_kubeletplugin.resourceslice.pools import DriverResources, Pool
from dra_kubeletplugin.resourceslice.sync import Plan, plan_sync

DRIVER = "gpu.example.com"
NODE = "node-1"


def _dev(name: str, memory: str = "68719476736") -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"model": {"string": "model-a"}},
        "capacity": {"memory": {"value": memory}},
    }


def _desired(*device_lists: list[str], generation: int = 0) -> Pool:
    return Pool(
        name=NODE,
        slices=[{"devices": [_dev(n) for n in names]} for names in device_lists],
        generation=generation,
    )


def _existing(
    index: int, names: list[str], *, generation: int = 1, count: int = 1, suffix: str = "abcde"
) -> dict[str, Any]:
    name = sync.generate_name(index, driver_name=DRIVER, node_name=NODE) + suffix
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "7"},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": NODE, "generation": generation, "resourceSliceCount": count},
            "nodeName": NODE,
            "devices": [_dev(n) for n in names],
        },
    }


def _plan(existing: list[dict[str, Any]], desired: Pool, **kw: Any) -> Plan:
    return plan_sync(existing, desired, driver_name=DRIVER, node_name=NODE, **kw)


def _summary(plan: Plan) -> dict[str, Any]:
    return {
        "generation": plan.generation,
        "delete": [s["metadata"]["name"][:5] + ("/" + s["metadata"]["name"][-5:]) for s in plan.delete],
        "update": [s["metadata"]["name"][:5] for s in plan.update],
        "create": [s["metadata"]["generateName"][:5] for s in plan.create],
    }


@pytest.mark.parametrize(
    ("existing", "desired", "expected"),
    [
        pytest.param(
            [],
            _desired(["dev-0"]),
            {"generation": 1, "delete": [], "update": [], "create": ["00000"]},
            id="first-publish-generation-1",
        ),
        pytest.param(
            [_existing(0, ["dev-0"])],
            _desired(["dev-0"]),
            {"generation": 1, "delete": [], "update": [], "create": []},
            id="unchanged-no-writes",
        ),
        pytest.param(
            [_existing(0, ["dev-0"])],
            _desired(["dev-0", "dev-1"]),
            {"generation": 1, "delete": [], "update": ["00000"], "create": []},
            id="one-changed-keeps-generation",
        ),
        pytest.param(
            [_existing(0, ["a"], count=2), _existing(1, ["b"], count=2)],
            _desired(["a", "x"], ["b", "y"]),
            {"generation": 2, "delete": [], "update": ["00000", "00001"], "create": []},
            id="two-changed-bump",
        ),
        pytest.param(
            [_existing(0, ["a"], count=2), _existing(1, ["b"], count=2)],
            _desired(["a"], ["b", "y"]),
            {"generation": 1, "delete": [], "update": ["00001"], "create": []},
            id="one-of-two-changed-keeps",
        ),
        pytest.param(
            [_existing(0, ["a"])],
            _desired(["a"], ["b"]),
            {"generation": 2, "delete": [], "update": ["00000"], "create": ["00001"]},
            id="new-slice-bumps-and-rewrites-all",
        ),
        pytest.param(
            [_existing(0, ["a"], count=3), _existing(1, ["b"], count=3), _existing(2, ["c"], count=3)],
            _desired(["a"]),
            {"generation": 1, "delete": ["00001/abcde", "00002/abcde"], "update": ["00000"], "create": []},
            id="shrink-deletes-extra-keeps-generation",
        ),
        pytest.param(
            [_existing(0, ["a"], generation=1), _existing(0, ["a"], generation=2, suffix="zzzzz")],
            _desired(["a"]),
            {"generation": 2, "delete": ["00000/abcde"], "update": [], "create": []},
            id="older-generation-obsolete",
        ),
        pytest.param(
            [_existing(0, ["a"]), _existing(0, ["a"], suffix="bbbbb")],
            _desired(["a"]),
            {"generation": 1, "delete": ["00000/bbbbb"], "update": [], "create": []},
            id="duplicate-index-second-obsolete",
        ),
        pytest.param(
            [
                {
                    **_existing(0, ["a"]),
                    "metadata": {"name": "node-1-gpu.example.com-q8x2z", "uid": "u", "resourceVersion": "1"},
                }
            ],
            _desired(["a"]),
            {"generation": 2, "delete": ["node-/q8x2z"], "update": [], "create": ["00000"]},
            id="pre-1.36-name-replaced",
        ),
        pytest.param(
            [_existing(0, ["a"]), _existing(5, ["x"])],
            _desired(["a"]),
            {"generation": 1, "delete": ["00005/abcde"], "update": [], "create": []},
            id="index-out-of-range-obsolete",
        ),
        pytest.param(
            [_existing(0, ["a"], generation=3)],
            _desired(["a"], generation=7),
            {"generation": 7, "delete": [], "update": ["00000"], "create": []},
            id="driver-generation-wins",
        ),
        pytest.param(
            [_existing(1, ["b"], count=2)],
            _desired(["a"], ["b"]),
            {"generation": 2, "delete": [], "update": ["00001"], "create": ["00000"]},
            id="matched-by-index-not-order",
        ),
    ],
)
def test_plan_table(existing: list[dict[str, Any]], desired: Pool, expected: dict[str, Any]) -> None:
    plan = _plan(existing, desired)
    assert _summary(plan) == expected
    for body in (*plan.update, *plan.create):  # every written slice carries the final pool fields
        assert body["spec"]["pool"] == {
            "name": NODE,
            "generation": expected["generation"],
            "resourceSliceCount": len(desired.slices),
        }
        assert body["spec"]["driver"] == DRIVER
        assert body["spec"]["nodeName"] == NODE


def test_update_keeps_metadata_for_optimistic_concurrency() -> None:
    old = _existing(0, ["a"])
    (body,) = _plan([old], _desired(["a", "b"])).update
    assert body["metadata"] == old["metadata"]
    assert [d["name"] for d in body["spec"]["devices"]] == ["a", "b"]


def test_device_order_matters() -> None:
    assert not _plan([_existing(0, ["a", "b"])], _desired(["b", "a"])).empty


@pytest.mark.parametrize(
    ("stored_memory", "changed"),
    [
        pytest.param("64Gi", False, id="canonical-quantity-equal"),
        pytest.param("68719476736", False, id="same-string"),
        pytest.param("32Gi", True, id="different-value"),
    ],
)
def test_quantities_compare_by_value(stored_memory: str, changed: bool) -> None:
    existing = _existing(0, ["a"])
    existing["spec"]["devices"][0]["capacity"]["memory"]["value"] = stored_memory
    assert (not _plan([existing], _desired(["a"])).empty) is changed


def test_server_side_empty_fields_are_not_changes() -> None:
    existing = _existing(0, ["a"])
    existing["spec"]["devices"][0]["taints"] = []
    existing["spec"]["nodeSelector"] = None
    assert _plan([existing], _desired(["a"])).empty


def test_ignored_fields_are_not_compared() -> None:
    desired = Pool(
        name=NODE,
        slices=[
            {
                "devices": [
                    {
                        **_dev("a"),
                        "consumesCounters": [{"counterSet": "die-0", "counters": {"memory": {"value": "1"}}}],
                    }
                ]
            },
            {"sharedCounters": [{"name": "die-0", "counters": {"memory": {"value": "1"}}}]},
        ],
    )
    stored_devices = _existing(0, ["a"], count=2)
    stored_counters = _existing(1, [], count=2)
    del stored_counters["spec"]["devices"]
    existing = [stored_devices, stored_counters]
    assert not _plan(existing, desired).empty
    assert _plan(existing, desired, ignore={"sharedCounters", "consumesCounters"}).empty


@pytest.mark.parametrize(
    ("edit", "dropped"),
    [
        pytest.param(lambda s: None, (), id="nothing-dropped"),
        pytest.param(lambda s: s.pop("sharedCounters"), ("sharedCounters",), id="shared-counters"),
        pytest.param(
            lambda s: s["devices"][0].pop("consumesCounters"), ("consumesCounters",), id="consumes-counters"
        ),
        pytest.param(
            lambda s: [
                s["devices"][0].pop("allowMultipleAllocations"),
                s["devices"][0]["capacity"]["memory"].pop("requestPolicy"),
            ],
            ("allowMultipleAllocations", "requestPolicy"),
            id="consumable-capacity",
        ),
    ],
)
def test_dropped_fields(edit: Any, dropped: tuple[str, ...]) -> None:
    sent = {
        "devices": [
            {
                "name": "shared-0",
                "allowMultipleAllocations": True,
                "capacity": {"memory": {"value": "1Gi", "requestPolicy": {"default": "128Mi"}}},
                "consumesCounters": [{"counterSet": "die-0", "counters": {"memory": {"value": "1"}}}],
            }
        ],
        "sharedCounters": [{"name": "die-0", "counters": {"memory": {"value": "1Gi"}}}],
    }
    stored = copy.deepcopy(sent)
    edit(stored)
    assert sync.dropped_fields(sent, stored) == dropped


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param("64Gi", Decimal(64 * 2**30), id="binary-suffix"),
        pytest.param("1k", Decimal(1000), id="decimal-suffix"),
        pytest.param("100m", Decimal("0.1"), id="milli"),
        pytest.param("1e3", Decimal(1000), id="exponent"),
        pytest.param("134217728", Decimal(134217728), id="plain"),
    ],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert sync.parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1Xi", "--1"])
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        sync.parse_quantity(text)


@pytest.mark.parametrize(
    ("name", "index"),
    [
        pytest.param("00000-gpu.example.com-node-1-abcde", 0, id="zero"),
        pytest.param("0001a-gpu.example.com-node-1-abcde", 26, id="hex"),
        pytest.param("00000-other.io-node-1-abcde", None, id="other-driver"),
        pytest.param("node-1-gpu.example.com-abcde", None, id="old-naming"),
        pytest.param("zzzzz-gpu.example.com-node-1-abcde", None, id="not-hex"),
    ],
)
def test_slice_index(name: str, index: int | None) -> None:
    assert sync.slice_index(name, driver_name=DRIVER, node_name=NODE) == index


def test_generate_name_truncated_like_the_apiserver() -> None:
    node = "n" * 80
    prefix = sync.generate_name(3, driver_name=DRIVER, node_name=node)
    assert len(prefix) == 58
    assert sync.slice_index(prefix + "abcde", driver_name=DRIVER, node_name=node) == 3


def test_every_pool_gets_its_plan_and_a_pool_no_longer_desired_is_deleted() -> None:
    existing = [_existing(0, ["dev-0"])]
    gone = copy.deepcopy(_existing(0, ["old-0"], suffix="zzzzz"))
    gone["spec"]["pool"]["name"] = "retired"
    plans = sync.plan_pools(
        [*existing, gone],
        DriverResources(
            pools={NODE: _desired(["dev-0"]), "extra": Pool(name="extra", slices=[{"devices": []}])}
        ),
        driver_name=DRIVER,
        node_name=NODE,
    )
    assert sorted(plans) == sorted([NODE, "extra", "retired"])
    assert plans[NODE].empty
    assert [s["metadata"]["generateName"][:5] for s in plans["extra"].create] == ["00000"]
    assert [s["metadata"]["name"] for s in plans["retired"].delete] == [gone["metadata"]["name"]]
    assert not plans["retired"].update and not plans["retired"].create


def _version(item: dict[str, Any], version: str, devices: list[str] | None = None) -> dict[str, Any]:
    out = copy.deepcopy(item)
    out["metadata"]["resourceVersion"] = version
    if devices is not None:
        out["spec"]["devices"] = [_dev(n) for n in devices]
    return out


def test_remembered_comparisons_plan_as_fresh_ones_and_compare_a_stored_version_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each step plans with the remembered answers and without them: the same plan every time; a
    stored version already compared with the same desired slice is not compared again."""
    comparisons = sync.Comparisons()
    stored = [_existing(0, ["dev-0"], count=2), _existing(1, ["dev-1"], count=2, suffix="fghij")]
    newer = [stored[0], _version(stored[1], "8", ["dev-9"])]
    pool = _desired(["dev-0"], ["dev-1"])
    other = _desired(["dev-0"], ["dev-1", "dev-2"])  # the second slice changed: a new pool
    steps = [
        (stored, pool, 2),  # compared once each
        (stored, pool, 0),  # the same versions against the same slices: remembered
        (newer, pool, 1),  # a new version: compared
        (newer, other, 2),  # new slices: compared
        (newer, other, 0),
        (stored, other, 1),  # back to version 7 of the second: compared again, not taken as 8's
    ]
    real = sync.specs_equal
    calls: list[int] = []

    def counting(stored_spec: Any, wanted: Any, ignore: Any = ()) -> bool:
        calls.append(1)
        return real(stored_spec, wanted, ignore)

    for existing, desired, compared in steps:
        fresh = _plan(existing, desired)
        calls.clear()
        with monkeypatch.context() as m:
            m.setattr(sync, "specs_equal", counting)
            assert _plan(existing, desired, comparisons=comparisons) == fresh
        assert len(calls) == compared
    ignoring = _plan(stored, other, comparisons=comparisons, ignore=["attributes"])
    assert ignoring == _plan(stored, other, ignore=["attributes"])
