"""The emulated inventory backend: defaults, overrides, shipped examples and every validation error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver import discovery
from dra_driver.devices import PCI_BUS_RE, VDIE_RE, DieMode, Health
from dra_driver.discovery import emulated
from dra_driver.errors import ErrorCode, InvalidInput
from flexnpu_testing import inventories

VDIE_A = "185011D4-21104518-A0C4ED94-14CC040A-56102003"
VDIE_B = "42C711D4-20B03704-10100A48-F4100000-00000000"


def parse(doc: object) -> Any:
    return emulated.parse_inventory(doc, source="node.yaml")


# -- shipped examples -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "models", "phy_ids", "modes", "die_indexes"),
    [
        pytest.param(
            "two-chip-910b3.yaml",
            ["910B3", "910B3"],
            [0, 1],
            {0: DieMode.WHOLE, 1: DieMode.SOFT},
            [0, 0],
            id="demo-two-910b3",
        ),
        pytest.param("a3-one-module.yaml", ["Ascend910"] * 2, [0, 1], {}, [0, 1], id="a3-two-dies"),
        pytest.param(
            "mixed-310p3.yaml",
            ["310P3", "310P3"],
            [0, 1],
            {0: DieMode.WHOLE, 1: DieMode.HARD},
            [0, 0],
            id="310p3-duo",
        ),
        pytest.param("eight-910b4.yaml", ["910B4"] * 8, list(range(8)), {}, [0] * 8, id="eight-910b4"),
    ],
)
def test_shipped_inventories(
    name: str, models: list[str], phy_ids: list[int], modes: dict[int, DieMode], die_indexes: list[int]
) -> None:
    inv = discovery.from_config(inventory=inventories.path(name), npu_smi="/nonexistent").discover()
    assert [d.model for d in inv.dies] == models
    assert [d.phy_id for d in inv.dies] == phy_ids
    assert [d.die_index for d in inv.dies] == die_indexes
    assert inv.die_modes == modes
    assert inv.driver_version and inv.firmware_version
    assert inv.source == f"emulated:{inventories.path(name)}"
    for die in inv.dies:
        assert VDIE_RE.match(die.vdie_id), die
        assert PCI_BUS_RE.match(die.pci_bus_id), die
        assert die.memory_mib == die.chip_model.memory_mib
        assert die.health is Health.HEALTHY
    assert len({d.vdie_id for d in inv.dies}) == len(inv.dies)
    assert len({d.pci_bus_id for d in inv.dies}) == len(inv.dies)


def test_shipped_names_match_directory() -> None:
    on_disk = sorted(p.name for p in inventories.DIR.glob("*.yaml"))
    assert on_disk == sorted(inventories.NAMES)
    assert inventories.DEMO in inventories.NAMES
    with pytest.raises(KeyError, match="no shipped inventory"):
        inventories.path("nope.yaml")


# -- defaults and overrides ---------------------------------------------------------------------


def test_defaults_are_deterministic_and_node_independent(tmp_path: Path) -> None:
    doc = {"chips": [{"model": "910B3", "card": 0}, {"model": "910B3", "card": 1}]}
    a, b = tmp_path / "a.yaml", tmp_path / "b.json"
    a.write_text(yaml.safe_dump(doc))
    b.write_text(json.dumps(doc))
    inv_a, inv_b = emulated.load_inventory(a), emulated.load_inventory(b)
    assert inv_a.dies == inv_b.dies  # same schema, YAML or JSON, any file name
    assert inv_a.dies == emulated.load_inventory(a).dies  # stable across reads
    assert [d.logic_id for d in inv_a.dies] == [0, 1]
    assert [d.pci_bus_id for d in inv_a.dies] == ["0000:10:00.0", "0000:18:00.0"]
    assert inv_a.die_modes == {}
    seeded = parse({**doc, "seed": "node-b"})
    assert {d.vdie_id for d in seeded.dies}.isdisjoint({d.vdie_id for d in inv_a.dies})


def test_a3_chip_yields_two_dies_with_chip_ids_per_die() -> None:
    inv = parse({"chips": [{"model": "Ascend910", "card": 3, "npuName": "9392", "numaNode": 1}]})
    assert [(d.card_id, d.chip_id, d.die_index) for d in inv.dies] == [(3, 0, 0), (3, 1, 1)]
    assert all(d.npu_name == "9392" and d.numa_node == 1 and d.memory_mib == 65536 for d in inv.dies)
    assert inv.dies[0].vdie_id != inv.dies[1].vdie_id


def test_overrides_win_and_defaults_step_around_explicit_ids() -> None:
    inv = parse(
        {
            "driverVersion": "24.1.rc3",
            "chips": [
                {"model": "910B4", "card": 0},  # defaults: phy 1 (0 is taken below), logic 0
                {
                    "model": "910B4",
                    "card": 1,
                    "phyId": 0,
                    "logicId": 5,
                    "vdieId": VDIE_A,
                    "busId": "0000:C1:00.0",
                    "numaNode": 1,
                    "memoryMiB": 65536,
                    "aicore": 10,
                    "aicpu": 3,
                    "health": "Unhealthy",
                    "mode": "hard",
                },
                {
                    "model": "Ascend910",
                    "card": 2,
                    "mode": "soft",
                    "dies": [{"phyId": 7, "vdieId": VDIE_B}, {"mode": "whole", "health": "Unknown"}],
                },
            ],
        }
    )
    by_phy = {d.phy_id: d for d in inv.dies}
    assert sorted(by_phy) == [0, 1, 2, 7]
    assert [d.phy_id for d in inv.dies] == [0, 1, 2, 7]  # sorted by physical ID
    first, second = by_phy[1], by_phy[0]
    assert (first.card_id, first.logic_id) == (0, 0)
    assert second.logic_id == 5 and second.vdie_id == VDIE_A and second.pci_bus_id == "0000:C1:00.0"
    assert (second.numa_node, second.memory_mib, second.aicore, second.aicpu) == (1, 65536, 10, 3)
    assert second.health is Health.UNHEALTHY
    assert by_phy[7].vdie_id == VDIE_B and by_phy[7].die_index == 0
    assert by_phy[2].die_index == 1 and by_phy[2].health is Health.UNKNOWN
    assert inv.die_modes == {0: DieMode.HARD, 7: DieMode.SOFT, 2: DieMode.WHOLE}
    assert inv.driver_version == "24.1.rc3" and inv.firmware_version == ""


def test_chip_index_defaults_per_card_around_explicit_ones() -> None:
    inv = parse(
        {
            "chips": [
                {"model": "310P3", "card": 1},
                {"model": "310P3", "card": 1, "chip": 0},
                {"model": "310P3", "card": 2},
            ]
        }
    )
    assert [(d.card_id, d.chip_id) for d in inv.dies] == [(1, 1), (1, 0), (2, 0)]


# -- validation ------------------------------------------------------------------------------------

ONE = {"model": "910B3", "card": 0}


@pytest.mark.parametrize(
    ("doc", "field", "message"),
    [
        pytest.param([], None, "must be a mapping", id="top-not-mapping"),
        pytest.param({}, "chips", "missing required field 'chips'", id="missing-chips"),
        pytest.param({"chips": []}, "chips", "at least one chip", id="empty-chips"),
        pytest.param({"chips": [ONE], "nodes": 1}, "nodes", "unknown field 'nodes'", id="unknown-top-field"),
        pytest.param({"chips": {"a": 1}}, "chips", "expected a list", id="chips-not-list"),
        pytest.param(
            {"chips": [ONE], "driverVersion": 24.1}, "driverVersion", "expected a string", id="version-float"
        ),
        pytest.param({"chips": ["910B3"]}, "chips[0]", "must be a mapping", id="chip-not-mapping"),
        pytest.param(
            {"chips": [{"card": 0}]}, "chips[0].model", "missing required field 'model'", id="missing-model"
        ),
        pytest.param(
            {"chips": [{"model": "910B3"}]},
            "chips[0].card",
            "missing required field 'card'",
            id="missing-card",
        ),
        pytest.param(
            {"chips": [ONE, ONE, {"model": "910B9", "card": 2}]},
            "chips[2].model",
            "unknown model '910B9'",
            id="unknown-model",
        ),
        pytest.param(
            {"chips": [{"model": 310, "card": 0}]}, "chips[0].model", "expected a string", id="model-int"
        ),
        pytest.param(
            {"chips": [{**ONE, "colour": "red"}]},
            "chips[0].colour",
            "unknown field 'colour'",
            id="unknown-chip-field",
        ),
        pytest.param(
            {"chips": [{**ONE, "card": "0"}]}, "chips[0].card", "expected an integer", id="card-string"
        ),
        pytest.param(
            {"chips": [{**ONE, "card": True}]}, "chips[0].card", "expected an integer", id="card-bool"
        ),
        pytest.param(
            {"chips": [{**ONE, "card": 64}]}, "chips[0].card", "between 0 and 63", id="card-too-big"
        ),
        pytest.param({"chips": [{**ONE, "chip": 4}]}, "chips[0].chip", "between 0 and 3", id="chip-too-big"),
        pytest.param(
            {"chips": [{**ONE, "chip": 0}, {**ONE, "chip": 0}]},
            "chips[1].chip",
            "duplicate chip 0 on card 0",
            id="duplicate-chip",
        ),
        pytest.param(
            {"chips": [{**ONE}] * 5}, "chips[4].card", "more than 4 chips", id="too-many-chips-on-card"
        ),
        pytest.param(
            {"chips": [{**ONE, "memoryMiB": 0}]}, "chips[0].memoryMiB", "must be positive", id="memory-zero"
        ),
        pytest.param(
            {"chips": [{**ONE, "memoryMiB": -1}]},
            "chips[0].memoryMiB",
            "must be positive",
            id="memory-negative",
        ),
        pytest.param(
            {"chips": [{**ONE, "aicore": 0}]}, "chips[0].aicore", "must be positive", id="aicore-zero"
        ),
        pytest.param({"chips": [{**ONE, "phyId": -1}]}, "chips[0].phyId", "at least 0", id="phy-negative"),
        pytest.param(
            {"chips": [{**ONE, "health": "OK"}]}, "chips[0].health", "not one of Healthy", id="bad-health"
        ),
        pytest.param(
            {"chips": [{**ONE, "mode": "shared"}]},
            "chips[0].mode",
            "not one of whole, soft, hard",
            id="bad-mode",
        ),
        pytest.param(
            {"chips": [{**ONE, "vdieId": "42C711D4 20B03704"}]},
            "chips[0].vdieId",
            "VDie ID",
            id="vdie-format",
        ),
        pytest.param(
            {"chips": [{**ONE, "vdieId": VDIE_A.lower()}]},
            "chips[0].vdieId",
            "upper-case",
            id="vdie-lowercase",
        ),
        pytest.param(
            {"chips": [{**ONE, "busId": "C1:00.0"}]}, "chips[0].busId", "PCI bus ID", id="bus-format"
        ),
        pytest.param(
            {"chips": [{**ONE, "busId": 10.5}]}, "chips[0].busId", "quote IDs in YAML", id="bus-yaml-float"
        ),
        pytest.param(
            {"chips": [{**ONE, "phyId": 3}, {"model": "910B3", "card": 1, "phyId": 3}]},
            "chips[1].phyId",
            "duplicate die: phyId 3 is also used by chips[0]",
            id="duplicate-phy",
        ),
        pytest.param(
            {"chips": [{**ONE, "logicId": 1}, {"model": "910B3", "card": 1, "logicId": 1}]},
            "chips[1].logicId",
            "duplicate die: logicId 1",
            id="duplicate-logic",
        ),
        pytest.param(
            {"chips": [{**ONE, "vdieId": VDIE_A}, {"model": "910B3", "card": 1, "vdieId": VDIE_A}]},
            "chips[1].vdieId",
            "duplicate die: vdieId",
            id="duplicate-vdie",
        ),
        pytest.param(
            {
                "chips": [
                    {**ONE, "busId": "0000:c1:00.0"},
                    {"model": "910B3", "card": 1, "busId": "0000:C1:00.0"},
                ]
            },
            "chips[1].busId",
            "duplicate die: busId",
            id="duplicate-bus-case-insensitive",
        ),
        pytest.param(
            {"chips": [{"model": "Ascend910", "card": 0, "phyId": 0}]},
            "chips[0].phyId",
            "set phyId under dies[]",
            id="a3-chip-level-id",
        ),
        pytest.param(
            {"chips": [{"model": "Ascend910", "card": 0, "dies": [{}]}]},
            "chips[0].dies",
            "2 die(s) per chip, got 1",
            id="a3-wrong-die-count",
        ),
        pytest.param(
            {"chips": [{"model": "Ascend910", "card": 0, "dies": [{}, {"memoryMiB": 0}]}]},
            "chips[0].dies[1].memoryMiB",
            "must be positive",
            id="die-level-error-path",
        ),
        pytest.param(
            {"chips": [{"model": "Ascend910", "card": 0, "dies": [{}, {"model": "x"}]}]},
            "chips[0].dies[1].model",
            "unknown field 'model'",
            id="die-unknown-field",
        ),
        pytest.param(
            {
                "chips": [
                    {
                        "model": "Ascend910",
                        "card": 0,
                        "dies": [{"busId": "0000:9D:00.0"}, {"busId": "0000:9D:00.0"}],
                    }
                ]
            },
            "chips[0].dies[1].busId",
            "duplicate die: busId 0000:9D:00.0 is also used by chips[0].dies[0]",
            id="duplicate-bus-within-a3",
        ),
    ],
)
def test_invalid_inventory(doc: object, field: str | None, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse(doc)
    err = info.value
    assert err.code is ErrorCode.INVALID_INVENTORY
    assert err.field == field
    assert message in err.message
    assert "node.yaml" in err.message


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        pytest.param("bad.yaml", "chips: [unclosed", "is not valid YAML", id="yaml-syntax"),
        pytest.param("bad.json", '{"chips": [}', "is not valid JSON", id="json-syntax"),
        pytest.param(
            "float-bus.yaml",
            "chips:\n  - {model: 910B3, card: 0, busId: 0000:01:00.0}\n",
            "quote IDs in YAML",
            id="yaml-sexagesimal-bus",
        ),
    ],
)
def test_invalid_file(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InvalidInput, match=message) as info:
        emulated.load_inventory(path)
    assert info.value.code is ErrorCode.INVALID_INVENTORY
    assert str(path) in info.value.message


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(InvalidInput, match="cannot read inventory file") as info:
        discovery.from_config(inventory=path, npu_smi="npu-smi").discover()
    assert str(path) in str(info.value)
    assert info.value.code is ErrorCode.INVALID_INVENTORY


def test_discover_rereads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({"chips": [ONE]}))
    backend = discovery.from_config(inventory=path, npu_smi="npu-smi")
    assert len(backend.discover().dies) == 1
    path.write_text(yaml.safe_dump({"chips": [ONE, {"model": "910B3", "card": 1}]}))
    assert len(backend.discover().dies) == 2
