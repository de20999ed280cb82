"""vNPU parsing and pure helpers: info-vnpu, vnpu-mode, free IDs, held resources."""

from __future__ import annotations

import pytest

from dra_driver.devices import Die, Inventory
from dra_driver.errors import ErrorCode, InvalidInput, StateError
from dra_driver.vnpu import Vnpu, free_vnpu_id, held_by
from dra_driver.vnpu.npu_smi import parse_info_vnpu, parse_vnpu_mode

DIE = Die(
    vdie_id="00000000-00000000-00000000-00000000-00000000",
    model="910B3",
    card_id=3,
    chip_id=0,
    phy_id=2,
    logic_id=2,
    pci_bus_id="0000:01:00.0",
    numa_node=0,
    memory_mib=65536,
    aicore=20,
    aicpu=7,
)

INFO = """\
+-------------------------------------------------------------------------------+
| NPU resource static info as follow:                                           |
| AICORE    Memory    AICPU                                                     |
| 5/20      16/64     3/7                                                       |
+-------------------------------------------------------------------------------+
| Total number of vnpu: 2                                                       |
+-------------------------------------------------------------------------------+
|  Vnpu ID  |  Vgroup ID     |  Container ID  |  Status  |  Template Name       |
+-------------------------------------------------------------------------------+
|  133      |  1             |  a1b2c3d4e5f6  |  1       |  vir05_1c_16g        |
|  132      |  0             |  000000000000  |  0       |  vir10_3c_32g        |
+-------------------------------------------------------------------------------+
"""


def test_parse_info_vnpu() -> None:
    assert parse_info_vnpu(INFO, die=DIE) == (
        Vnpu(132, 2, 3, 0, "vir10_3c_32g", vgroup=0, in_use=False),
        Vnpu(133, 2, 3, 0, "vir05_1c_16g", vgroup=1, in_use=True),
    )
    empty = "| Total number of vnpu: 0 |\n"
    assert parse_info_vnpu(empty, die=DIE) == ()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        pytest.param("garbage\n", "Total number of vnpu", id="no-total"),
        pytest.param(INFO.replace("vnpu: 2", "vnpu: 3"), "3 vNPU", id="count-mismatch"),
        pytest.param(
            INFO.replace("|  133      |", "|  13x      |").replace("133", "13x"), "2 vNPU", id="bad-id"
        ),
        pytest.param(INFO.replace("Template Name", "Flavour"), "no table", id="unknown-columns"),
        pytest.param(INFO.replace("|  1       |", "|  one     |"), "integers", id="bad-status"),
    ],
)
def test_parse_info_vnpu_rejects(text: str, words: str) -> None:
    with pytest.raises(InvalidInput, match=words) as info:
        parse_info_vnpu(text, die=DIE)
    assert info.value.code == ErrorCode.INVALID_NPU_SMI


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        pytest.param("vnpu-mode : container\n", "container", id="word"),
        pytest.param("| Vnpu mode : 0 |\n", "container", id="number"),
        pytest.param("vnpu_mode: vm\n", "vm", id="vm"),
    ],
)
def test_parse_vnpu_mode(text: str, mode: str) -> None:
    assert parse_vnpu_mode(text) == mode


@pytest.mark.parametrize("text", ["vnpu-mode : sideways\n", "nothing\n"])
def test_parse_vnpu_mode_rejects(text: str) -> None:
    with pytest.raises(InvalidInput):
        parse_vnpu_mode(text)


def test_free_vnpu_id() -> None:
    assert free_vnpu_id(DIE, []) == 132
    assert free_vnpu_id(DIE, [132, 134]) == 133
    with pytest.raises(StateError) as info:
        free_vnpu_id(DIE, range(132, 140))
    assert info.value.code == ErrorCode.VNPU_ID_IN_USE


def test_held_by_counts_unknown_templates_as_the_whole_die() -> None:
    inv = Inventory(dies=(DIE,))
    vnpus = [Vnpu(132, 2, 3, 0, "vir10_3c_32g"), Vnpu(133, 2, 3, 0, "vir05_1c_16g")]
    assert held_by(vnpus, inv) == {2: (15, 4, 48 * 1024, 0, 2)}
    assert held_by([Vnpu(132, 2, 3, 0, "vir99")], inv) == {2: (20, 7, 65536, 0, 1)}
