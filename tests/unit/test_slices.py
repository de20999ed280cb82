"""What a node publishes: devices, attributes, capacities, counters, splitting and pre-validation."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from dra_driver import slices
from dra_driver.devices import GIB, MIB, Die, DieMode, Health, Inventory
from dra_driver.errors import ErrorCode, InvalidInput
from dra_kubeletplugin.resourceslice import pools
from dra_kubeletplugin.resourceslice.sync import specs_equal
from flexnpu_wire.codes import Policy

DRIVER = "npu.flexnpu.io"
NODE = "node-1"


def _die(phy: int, model: str = "910B3", *, memory_mib: int = 65536, die_index: int = 0, **kw: Any) -> Die:
    return Die(
        vdie_id=f"{phy:08X}-00000000-00000000-00000000-00000000",
        model=model,
        card_id=phy // 2 if model == "Ascend910" else phy,
        chip_id=0,
        phy_id=phy,
        logic_id=phy,
        pci_bus_id=f"0000:{phy + 1:02x}:00.0",
        numa_node=phy % 2,
        memory_mib=memory_mib,
        aicore=kw.pop("aicore", 20),
        aicpu=kw.pop("aicpu", 7),
        die_index=die_index,
        **kw,
    )


A2 = Inventory(dies=(_die(1), _die(0)), driver_version="25.5.0", firmware_version="7.7.0.1")
A3 = Inventory(
    dies=(
        _die(0, "Ascend910", die_index=0, npu_name="9392", aicore=24),
        _die(1, "Ascend910", die_index=1, npu_name="9392", aicore=24),
    )
)
P310 = Inventory(dies=(_die(0, "310P3", memory_mib=21527, aicore=8),))


def _pool(inv: Inventory, **kw: Any) -> slices.DesiredPool:
    return slices.build_pool(inv, driver_name=DRIVER, node_name=NODE, **kw)


def _devices(pool: slices.DesiredPool) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in pool.slices for d in s.get("devices", [])}


def _counter_sets(pool: slices.DesiredPool) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for s in pool.slices for c in s.get("sharedCounters", [])}


def _mode(mode: DieMode) -> Any:
    return lambda _die: mode


def _shares(phy: int) -> list[str]:
    """A die's share devices, one per policy (elastic, the default, keeps the old name)."""
    return [f"vnpu-{phy}", f"vnpu-{phy}-fixed", f"vnpu-{phy}-best-effort"]


@pytest.mark.parametrize(
    ("inventory", "mode", "use_counters", "names", "counter_sets"),
    [
        pytest.param(A2, DieMode.WHOLE, True, ["npu-0", "npu-1"], [], id="a2-whole"),
        pytest.param(A2, DieMode.SOFT, True, [*_shares(1), *_shares(0)], [], id="a2-soft"),
        pytest.param(
            A2,
            DieMode.BOTH,
            True,
            ["npu-0", "npu-1", *_shares(1), *_shares(0)],
            ["die-0", "die-1"],
            id="a2-both",
        ),
        pytest.param(A2, DieMode.BOTH, False, ["npu-0", "npu-1"], [], id="a2-both-without-counters"),
        pytest.param(
            A3,
            DieMode.BOTH,
            True,
            ["npu-0", "npu-1", *_shares(1), *_shares(0)],
            ["die-0", "die-1"],
            id="a3-both",
        ),
        pytest.param(P310, DieMode.WHOLE, True, ["npu-0"], [], id="310p-whole"),
        pytest.param(P310, DieMode.BOTH, True, ["npu-0", *_shares(0)], ["die-0"], id="310p-both"),
        pytest.param(Inventory(dies=()), DieMode.BOTH, True, [], [], id="empty-node"),
    ],
)
def test_device_names_and_counter_sets(
    inventory: Inventory, mode: DieMode, use_counters: bool, names: list[str], counter_sets: list[str]
) -> None:
    pool = _pool(inventory, mode_of=_mode(mode), use_counters=use_counters)
    assert pool.name == NODE
    assert pool.device_names == names
    assert list(_counter_sets(pool)) == counter_sets
    for spec in pool.slices:  # 1.35+: devices XOR sharedCounters
        assert ("devices" in spec) != ("sharedCounters" in spec)
    pools.validate(pool)


def test_empty_node_publishes_one_empty_slice() -> None:
    assert _pool(Inventory(dies=())).slices == [{"devices": []}]


def test_whole_device_attributes_and_capacity() -> None:
    device = _devices(_pool(A2, mode_of=_mode(DieMode.WHOLE)))["npu-1"]
    assert device == {
        "name": "npu-1",
        "attributes": {
            "cardID": {"int": 1},
            "chipID": {"int": 0},
            "dieIndex": {"int": 0},
            "driverVersion": {"string": "25.5.0"},
            "firmwareVersion": {"string": "7.7.0.1"},
            "generation": {"string": "A2"},
            "healthy": {"bool": True},
            "logicID": {"int": 1},
            "mode": {"string": "whole"},
            "model": {"string": "910B3"},
            "numaNode": {"int": 1},
            "phyID": {"int": 1},
            "resource.kubernetes.io/pciBusID": {"string": "0000:02:00.0"},
            "socName": {"string": "Ascend910B3"},
            "uuid": {"string": "00000001-00000000-00000000-00000000-00000000"},
            "vdieID": {"string": "00000001-00000000-00000000-00000000-00000000"},
        },
        "capacity": {
            "aicore": {"value": "20"},
            "aicpu": {"value": "7"},
            "compute": {"value": "100"},
            "memory": {"value": str(64 * GIB)},
        },
    }
    assert len(device["attributes"]) + len(device["capacity"]) <= 32


@pytest.mark.parametrize(
    ("inventory", "device", "attribute", "value"),
    [
        pytest.param(A3, "npu-1", "socName", {"string": "Ascend910_9392"}, id="a3-soc-name"),
        pytest.param(A3, "npu-1", "dieIndex", {"int": 1}, id="a3-second-die"),
        pytest.param(A3, "npu-1", "generation", {"string": "A3"}, id="a3-generation"),
        pytest.param(P310, "npu-0", "model", {"string": "310P3"}, id="310p-model"),
        pytest.param(P310, "vnpu-0", "mode", {"string": "soft"}, id="soft-mode-attribute"),
        pytest.param(P310, "vnpu-0", "policy", {"string": "elastic"}, id="elastic-share-device"),
        pytest.param(P310, "vnpu-0-fixed", "policy", {"string": "fixed"}, id="fixed-share-device"),
        pytest.param(P310, "vnpu-0-fixed", "mode", {"string": "soft-fixed"}, id="fixed-share-mode"),
        pytest.param(
            P310, "vnpu-0-best-effort", "mode", {"string": "soft-best-effort"}, id="best-effort-mode"
        ),
        pytest.param(
            Inventory(dies=(_die(0, health=Health.UNHEALTHY),)),
            "npu-0",
            "healthy",
            {"bool": False},
            id="unhealthy",
        ),
    ],
)
def test_attribute_table(inventory: Inventory, device: str, attribute: str, value: dict[str, Any]) -> None:
    assert _devices(_pool(inventory))[device]["attributes"][attribute] == value


def test_versions_left_out_when_unknown() -> None:
    attrs = _devices(_pool(A3))["npu-0"]["attributes"]
    assert "driverVersion" not in attrs
    assert "firmwareVersion" not in attrs


@pytest.mark.parametrize(
    ("inventory", "memory_max"),
    [
        pytest.param(A2, 64 * GIB, id="a2-64g"),
        pytest.param(P310, 21504 * MIB, id="310p-rounded-down-to-128mi"),
    ],
)
def test_soft_device_request_policy(inventory: Inventory, memory_max: int) -> None:
    device = _devices(_pool(inventory, mode_of=_mode(DieMode.SOFT)))["vnpu-0"]
    assert device["allowMultipleAllocations"] is True
    assert "consumesCounters" not in device
    memory = device["capacity"]["memory"]
    assert memory["value"] == str(inventory.dies[0].memory_bytes)
    assert memory["requestPolicy"] == {
        "default": str(128 * MIB),
        "validRange": {"min": str(128 * MIB), "max": str(memory_max), "step": str(128 * MIB)},
    }
    # every capacity is consumed per share, each one with a request policy
    assert set(device["capacity"]) == {"memory", "compute", "shares"}
    assert device["capacity"]["shares"] == {
        "value": "63",
        "requestPolicy": {"default": "1", "validValues": ["1"]},
    }
    assert device["attributes"]["aicore"] == {"int": inventory.dies[0].aicore}
    compute = device["capacity"]["compute"]
    assert compute == {
        "value": "100",
        "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "100", "step": "1"}},
    }


def test_share_limit_is_the_shares_capacity() -> None:
    device = _devices(_pool(A2, max_shares_per_die=5))["vnpu-0"]
    assert device["capacity"]["shares"]["value"] == "5"
    with pytest.raises(InvalidInput) as info:
        _pool(A2, max_shares_per_die=0)
    assert info.value.field == "max-shares-per-die"


def test_both_mode_counters() -> None:
    pool = _pool(A2, mode_of=_mode(DieMode.BOTH))
    devices = _devices(pool)
    assert _counter_sets(pool)["die-0"] == {
        "name": "die-0",
        "counters": {"compute": {"value": "100"}, "memory": {"value": str(64 * GIB)}},
    }
    assert devices["npu-0"]["consumesCounters"] == [
        {"counterSet": "die-0", "counters": {"compute": {"value": "100"}, "memory": {"value": str(64 * GIB)}}}
    ]
    for name in _shares(0):
        assert devices[name]["consumesCounters"] == [
            {"counterSet": "die-0", "counters": {"memory": {"value": "1"}}}
        ]


# A small model of the allocator's counter accounting, to check the exclusion rules of "both".


def _fits(pool: slices.DesiredPool, allocated: list[str], candidate: str, *, per_share: bool) -> bool:
    """Would ``candidate`` fit given ``allocated`` (device names; repeats = several shares)?

    ``per_share=False``: counters of an allocated device are used once (IsDeviceAllocated);
    ``per_share=True``: once per allocation.
    """
    available = {
        name: {c: Decimal(v["value"]) for c, v in cs["counters"].items()}
        for name, cs in _counter_sets(pool).items()
    }
    devices = _devices(pool)
    counted = allocated if per_share else list(dict.fromkeys(allocated))
    for name in [*counted, candidate]:
        for use in devices[name].get("consumesCounters", []):
            for counter, v in use["counters"].items():
                available[use["counterSet"]][counter] -= Decimal(v["value"])
    return all(v >= 0 for cs in available.values() for v in cs.values())


@pytest.mark.parametrize(
    "per_share", [pytest.param(False, id="once-per-device"), pytest.param(True, id="per-share")]
)
@pytest.mark.parametrize(
    ("allocated", "candidate", "fits"),
    [
        pytest.param([], "npu-0", True, id="whole-on-idle-die"),
        pytest.param([], "vnpu-0", True, id="share-on-idle-die"),
        pytest.param(["vnpu-0"], "npu-0", False, id="share-blocks-whole"),
        pytest.param(["vnpu-0"] * 100, "npu-0", False, id="many-shares-block-whole"),
        pytest.param(["vnpu-0"] * 100, "vnpu-0", True, id="shares-do-not-block-shares"),
        pytest.param(["npu-0"], "vnpu-0", False, id="whole-blocks-share"),
        pytest.param(["npu-0"], "npu-1", True, id="other-die-unaffected"),
        pytest.param(["vnpu-1"], "npu-0", True, id="share-on-other-die"),
    ],
)
def test_counters_keep_whole_and_shares_apart(
    allocated: list[str], candidate: str, fits: bool, per_share: bool
) -> None:
    pool = _pool(A2, mode_of=_mode(DieMode.BOTH))
    assert _fits(pool, allocated, candidate, per_share=per_share) is fits


@pytest.mark.parametrize("mode", [DieMode.SOFT, DieMode.BOTH, DieMode.ALL])
@pytest.mark.parametrize(
    ("running", "untainted"),
    [
        pytest.param(Policy.FIXED, "vnpu-0-fixed", id="a-fixed-die"),
        pytest.param(Policy.ELASTIC, "vnpu-0", id="an-elastic-die"),
        pytest.param(Policy.BEST_EFFORT, "vnpu-0-best-effort", id="a-best-effort-die"),
    ],
)
def test_a_die_offers_new_shares_only_of_the_policy_it_runs(
    mode: DieMode, running: Policy, untainted: str
) -> None:
    pool = _pool(A2, mode_of=_mode(mode), policies={0: running})
    devices = _devices(pool)
    for name in _shares(0):
        taints = devices[name].get("taints") or []
        want = [] if name == untainted else [
            {"key": "npu.flexnpu.io/share-policy", "value": str(running), "effect": "NoSchedule"}
        ]  # fmt: skip
        assert taints == want, name
    assert not any(devices[n].get("taints") for n in _shares(1))  # die 1 runs nothing: every policy offered
    pools.validate(pool)


def test_counters_cannot_keep_policies_apart_so_the_pool_does() -> None:
    """Why a taint: the allocator charges a shared device's counters again for each new share, so a
    counter that one policy's device used up would also stop that device's own second share."""
    pool = _pool(A2, mode_of=_mode(DieMode.BOTH))
    assert _fits(pool, ["vnpu-0"], "vnpu-0", per_share=True)  # shares of one device pile up
    assert _fits(pool, ["vnpu-0"], "vnpu-0-fixed", per_share=False)  # and counters allow a second policy
    tainted = _devices(_pool(A2, mode_of=_mode(DieMode.BOTH), policies={0: Policy.ELASTIC}))
    assert tainted["vnpu-0-fixed"]["taints"][0]["effect"] == "NoSchedule"  # the pool does not


@pytest.mark.parametrize(
    ("dies", "mode", "device_slices", "counter_slices"),
    [
        pytest.param(100, DieMode.BOTH, [64] * 6 + [16], [8] * 12 + [4], id="100-dies-both"),
        pytest.param(100, DieMode.WHOLE, [100], [], id="100-dies-whole"),
        pytest.param(200, DieMode.WHOLE, [128, 72], [], id="200-dies-whole"),
        pytest.param(130, DieMode.SOFT, [128, 128, 128, 6], [], id="130-dies-soft"),
        pytest.param(8, DieMode.BOTH, [32], [8], id="8-dies-one-counter-slice"),
        pytest.param(9, DieMode.BOTH, [36], [8, 1], id="9-dies-two-counter-slices"),
    ],
)
def test_split_by_limits(
    dies: int, mode: DieMode, device_slices: list[int], counter_slices: list[int]
) -> None:
    inv = Inventory(dies=tuple(_die(i) for i in range(dies)))
    pool = _pool(inv, mode_of=_mode(mode))
    assert [len(s["devices"]) for s in pool.slices if "devices" in s] == device_slices
    assert [len(s["sharedCounters"]) for s in pool.slices if "sharedCounters" in s] == counter_slices
    # device slices first, then counter slices
    kinds = ["devices" if "devices" in s else "counters" for s in pool.slices]
    assert kinds == sorted(kinds, key=lambda k: k != "devices")
    pools.validate(pool)


def test_deterministic_whatever_the_discovery_order() -> None:
    dies = [_die(i) for i in range(6)]
    a = _pool(Inventory(dies=tuple(dies)))
    b = _pool(Inventory(dies=tuple(reversed(dies))))
    assert a == b


def test_resolve_mode_per_die_override() -> None:
    inv = Inventory(dies=(_die(0), _die(1)), die_modes={1: DieMode.SOFT})
    assert slices.resolve_mode(inv.dies[0], inv, "whole") == DieMode.WHOLE
    assert slices.resolve_mode(inv.dies[1], inv, "whole") == DieMode.SOFT
    assert slices.resolve_mode(inv.dies[0], inv, "both") == DieMode.BOTH
    pool = _pool(inv, mode_of=lambda d: slices.resolve_mode(d, inv, "whole"))
    assert pool.device_names == ["npu-0", *_shares(1)]


def test_default_mode_is_both() -> None:
    assert _pool(A2).device_names == ["npu-0", "npu-1", *_shares(1), *_shares(0)]


@pytest.mark.parametrize(
    ("call", "field"),
    [
        pytest.param(
            lambda: slices.resolve_mode(_die(0), A2, "shared"), "default-mode", id="unknown-default"
        ),
        pytest.param(
            lambda: slices.resolve_mode(_die(0), Inventory(dies=(), die_modes={0: "bogus"}), "whole"),  # type: ignore[dict-item]
            "dies[0].mode",
            id="unknown-per-die",
        ),
        pytest.param(lambda: _pool(A2, fallback_mode=DieMode.BOTH), "fallback_mode", id="bad-fallback"),
    ],
)
def test_mode_errors(call: Any, field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        call()
    assert info.value.field == field
    assert info.value.code == ErrorCode.INVALID_CONFIG


def test_soft_fallback_without_counters() -> None:
    pool = _pool(A2, use_counters=False, fallback_mode=DieMode.SOFT)
    assert pool.device_names == [*_shares(1), *_shares(0)]
    assert all("consumesCounters" not in d for d in _devices(pool).values())


# --- pre-validation ------------------------------------------------------------------------

_BASE = _pool(A2, mode_of=_mode(DieMode.BOTH))


def _broken(edit: Any) -> slices.DesiredPool:
    pool = copy.deepcopy(_BASE)
    edit(pool.slices)
    return pool


def _many_devices(s: list[dict[str, Any]]) -> None:
    template = s[0]["devices"][0]
    s[0]["devices"] = [{**copy.deepcopy(template), "name": f"npu-{i}"} for i in range(65)]


def _many_attributes(s: list[dict[str, Any]]) -> None:
    s[0]["devices"][0]["attributes"].update({f"extra{i}": {"int": i} for i in range(20)})


@pytest.mark.parametrize(
    ("edit", "field", "text"),
    [
        pytest.param(
            lambda s: s[0]["devices"].append(copy.deepcopy(s[0]["devices"][0])),
            "slices[0].devices[8].name",
            "duplicate device name 'npu-0'",
            id="duplicate-device",
        ),
        pytest.param(
            lambda s: s[1]["sharedCounters"].append(copy.deepcopy(s[1]["sharedCounters"][0])),
            "slices[1].sharedCounters[2].name",
            "duplicate counter set name 'die-0'",
            id="duplicate-counter-set",
        ),
        pytest.param(
            lambda s: s[0]["devices"][0]["consumesCounters"][0].update(counterSet="die-9"),
            "slices[0].devices[0].consumesCounters[0].counterSet",
            "unknown counter set 'die-9'",
            id="unknown-counter-set",
        ),
        pytest.param(
            lambda s: s[0]["devices"][0]["consumesCounters"][0]["counters"].update(aicore={"value": "1"}),
            "slices[0].devices[0].consumesCounters[0].counters.aicore",
            "has no counter 'aicore'",
            id="unknown-counter",
        ),
        pytest.param(
            _many_devices, "slices[0].devices", "65 devices > 64", id="too-many-devices-with-counters"
        ),
        pytest.param(
            lambda s: s[1]["sharedCounters"].extend(
                {"name": f"x-{i}", "counters": {"m": {"value": "1"}}} for i in range(7)
            ),
            "slices[1].sharedCounters",
            "9 counter sets > 8",
            id="too-many-counter-sets",
        ),
        pytest.param(
            lambda s: s[0].update(sharedCounters=[]),
            "slices[0]",
            "either devices or sharedCounters",
            id="devices-and-counters",
        ),
        pytest.param(
            lambda s: s[0]["devices"][0]["capacity"]["memory"].update(requestPolicy={"default": "1"}),
            "slices[0].devices[0].capacity.memory.requestPolicy",
            "needs allowMultipleAllocations",
            id="request-policy-on-exclusive-device",
        ),
        pytest.param(
            lambda s: s[0]["devices"][0].update(name="NPU_0"),
            "slices[0].devices[0].name",
            "not a DNS label",
            id="bad-device-name",
        ),
        pytest.param(
            _many_attributes,
            "slices[0].devices[0]",
            "40 attributes+capacities > 32",
            id="too-many-attributes",
        ),
        pytest.param(
            lambda s: s[0]["devices"][0]["attributes"].update(model={"string": "x" * 65}),
            "slices[0].devices[0].attributes.model",
            "string longer than 64",
            id="long-string",
        ),
        pytest.param(
            lambda s: s[0]["devices"][0]["capacity"]["memory"].update(value=64),
            "slices[0].devices[0].capacity.memory.value",
            "quantity string",
            id="int-quantity",
        ),
        pytest.param(lambda s: s.clear(), "slices", "at least one", id="no-slices"),
    ],
)
def test_validate_pool_rejects(edit: Any, field: str, text: str) -> None:
    """The helper's check, which publishing runs on the built pool, names the field."""
    with pytest.raises(pools.PoolInvalid) as info:
        pools.validate(_broken(edit))
    assert info.value.field == field
    assert text in str(info.value)


def test_validate_pool_accepts_the_built_pool() -> None:
    pools.validate(_BASE)


# -- unhealthy dies are tainted ---------------------------------------------------------------


def _inventory_with_health(*healths: Health) -> Inventory:
    dies = tuple(
        Die(
            vdie_id=f"{i:08X}-00000000-00000000-00000000-00000000",
            model="910B3",
            card_id=i,
            chip_id=0,
            phy_id=i,
            logic_id=i,
            pci_bus_id=f"0000:{i + 1:02x}:00.0",
            numa_node=0,
            memory_mib=65536,
            aicore=20,
            aicpu=7,
            health=h,
        )
        for i, h in enumerate(healths)
    )
    return Inventory(dies=dies)


@pytest.mark.parametrize("use_counters", [True, False])
def test_unhealthy_die_devices_carry_a_noschedule_taint(use_counters: bool) -> None:
    inv = _inventory_with_health(Health.HEALTHY, Health.UNHEALTHY)
    pool = slices.build_pool(inv, driver_name="npu.flexnpu.io", node_name="n1", use_counters=use_counters)
    devices = {d["name"]: d for s in pool.slices for d in s.get("devices", [])}
    tainted = {name for name, d in devices.items() if d.get("taints")}
    assert tainted == {name for name, d in devices.items() if d["attributes"]["phyID"] == {"int": 1}}
    assert tainted
    for name in tainted:
        assert devices[name]["taints"] == [
            {"key": "npu.flexnpu.io/unhealthy", "value": "true", "effect": "NoSchedule"}
        ]
        assert devices[name]["attributes"]["healthy"] == {"bool": False}


def test_server_stamped_taint_time_is_not_a_change() -> None:
    wanted = {
        "devices": [{"name": "npu-1", "taints": [{"key": "k", "value": "true", "effect": "NoSchedule"}]}]
    }
    stored = {
        "devices": [
            {
                "name": "npu-1",
                "taints": [
                    {"key": "k", "value": "true", "effect": "NoSchedule", "timeAdded": "2026-11-30T12:00:00Z"}
                ],
            }
        ]
    }
    assert specs_equal(stored, wanted)
    stored["devices"][0]["taints"][0]["effect"] = "NoExecute"
    assert not specs_equal(stored, wanted)


# --- hard-split templates (modes hard and all) ----------------------------------------------

A3_16 = Inventory(
    dies=tuple(_die(p, "Ascend910", die_index=p % 2, npu_name="9392", aicore=24) for p in range(16))
)
B3 = Inventory(dies=(_die(0, "910B3"),))


def test_hard_mode_publishes_one_device_per_template_instance() -> None:
    pool = _pool(B3, mode_of=_mode(DieMode.HARD))
    # vir05_1c_16g: min(20/5, 7/1, 64/16) = 4; vir10_3c_32g: min(2, 2, 2) = 2; no whole, no soft device
    assert pool.device_names == [
        *(f"npu-0-vir05-1c-16g-{i}" for i in range(4)),
        "npu-0-vir10-3c-32g-0",
        "npu-0-vir10-3c-32g-1",
    ]
    dev = _devices(pool)["npu-0-vir10-3c-32g-1"]
    assert dev["attributes"]["template"] == {"string": "vir10_3c_32g"}
    assert dev["attributes"]["mode"] == {"string": "hard"}
    assert dev["capacity"] == {
        "aicore": {"value": "10"},
        "aicpu": {"value": "3"},
        "memory": {"value": str(32 * GIB)},
    }
    assert dev["consumesCounters"] == [
        {
            "counterSet": "die-0",
            "counters": {
                "aicore": {"value": "10"},
                "aicpu": {"value": "3"},
                "memory": {"value": str(32 * GIB)},
                "vnpus": {"value": "1"},
            },
        }
    ]
    assert "allowMultipleAllocations" not in dev
    assert _counter_sets(pool)["die-0"]["counters"] == {
        "aicore": {"value": "20"},
        "aicpu": {"value": "7"},
        "memory": {"value": str(64 * GIB)},
        "vnpus": {"value": "8"},
    }
    pools.validate(pool)


def test_all_mode_keeps_shares_and_templates_apart_with_the_vnpus_counter() -> None:
    pool = _pool(B3, mode_of=_mode(DieMode.ALL), max_shares_per_die=63)
    devs = _devices(pool)
    # whole and share devices first, then the template instances (dra_driver/placement.py layout)
    assert pool.device_names[0] == "npu-0" and pool.device_names[1:4] == _shares(0)
    assert devs["npu-0"]["consumesCounters"][0]["counters"] == {
        "aicore": {"value": "20"},
        "aicpu": {"value": "7"},
        "memory": {"value": str(64 * GIB)},
    }
    # the die's four counters and no more: one per share device would make the pool slow to walk
    counters = _counter_sets(pool)["die-0"]["counters"]
    assert sorted(counters) == ["aicore", "aicpu", "memory", "vnpus"]
    for name in _shares(0):  # the memory token keeps the whole device off, all of vnpus the templates
        assert devs[name]["consumesCounters"][0]["counters"] == {
            "memory": {"value": "1"},
            "vnpus": counters["vnpus"],
        }
    templates = pool.device_names[4:]
    assert len(templates) == 6
    for name in templates:
        assert devs[name]["consumesCounters"][0]["counters"]["vnpus"] == {"value": "1"}
    pools.validate(pool)


def test_310p_templates_consume_media_and_the_nominal_memory() -> None:
    pool = _pool(P310, mode_of=_mode(DieMode.HARD))
    devs = _devices(pool)
    names = [n for n in pool.device_names if "vir04-4c-dvpp" in n]
    assert names == ["npu-0-vir04-4c-dvpp-0"]  # 7 AI CPUs / 4 = 1
    assert devs[names[0]]["capacity"]["media"] == {"value": "8"}
    assert devs["npu-0-vir04-3c-ndvpp-1"]["capacity"]["media"] == {"value": "0"}
    assert len([n for n in pool.device_names if "-vir01-" in n]) == 7  # 8 AI Cores, but 7 AI CPUs
    # 2 x 12 GB templates fit the 24 GB the HDK divides, though npu-smi shows 21527 MiB usable
    assert _counter_sets(pool)["die-0"]["counters"]["memory"] == {"value": str(24 * GIB)}
    assert _counter_sets(pool)["die-0"]["counters"]["media"] == {"value": "8"}
    pools.validate(pool)


def test_sixteen_a3_dies_with_all_templates_respect_the_api_limits() -> None:
    pool = _pool(A3_16, mode_of=_mode(DieMode.ALL))
    pools.validate(pool)
    device_slices = [s for s in pool.slices if "devices" in s]
    counter_slices = [s for s in pool.slices if "sharedCounters" in s]
    # 16 x (whole + 3 share devices + 6 templates)
    assert [len(s["devices"]) for s in device_slices] == [64, 64, 32]
    assert [len(s["sharedCounters"]) for s in counter_slices] == [8, 8]
    assert all(len(d.get("consumesCounters") or []) <= 2 for s in device_slices for d in s["devices"])


def test_held_resources_shrink_the_die_and_drop_whole_and_soft() -> None:
    held = {0: slices.Held(aicore=10, aicpu=3, memory_mib=32 * 1024, vnpus=1)}
    pool = _pool(B3, mode_of=_mode(DieMode.ALL), held=held)
    assert "npu-0" not in pool.device_names and "vnpu-0" not in pool.device_names
    assert pool.device_names == [*(f"npu-0-vir05-1c-16g-{i}" for i in range(2)), "npu-0-vir10-3c-32g-0"]
    counters = _counter_sets(pool)["die-0"]["counters"]
    assert (counters["aicore"], counters["vnpus"]) == ({"value": "10"}, {"value": "7"})


def test_hard_without_counters_falls_back() -> None:
    pool = _pool(B3, mode_of=_mode(DieMode.HARD), use_counters=False)
    assert pool.device_names == ["npu-0"]


def test_template_overrides_from_the_inventory() -> None:
    from dra_driver.templates import Template

    inv = Inventory(dies=B3.dies, templates={"910B3": (Template("vir20_7c_64g", 20, 7, 65536),)})
    assert _pool(inv, mode_of=_mode(DieMode.HARD)).device_names == ["npu-0-vir20-7c-64g-0"]


def test_template_device_names_parse_back() -> None:
    from dra_driver.devices import parse_template_device_name

    assert parse_template_device_name("npu-12-vir04-3c-ndvpp-1") == (12, "vir04_3c_ndvpp", 1)
    assert parse_template_device_name("npu-12") is None
    assert parse_template_device_name("vnpu-1") is None


def test_inventory_knows_the_mode_of_every_published_device() -> None:
    assert B3.by_device_name("npu-0-vir10-3c-32g-1") == B3.dies[0]
    assert [B3.device_mode(n) for n in ("npu-0", "vnpu-0", "npu-0-vir10-3c-32g-1", "npu-9", "x")] == [
        DieMode.WHOLE,
        DieMode.SOFT,
        DieMode.HARD,
        None,
        None,
    ]
