"""npu-smi discovery: recorded A2/A3/310P outputs -> dies, every malformed input -> a named error,
and one run through the real subprocess path with a fake npu-smi executable."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from dra_driver import discovery
from dra_driver.devices import VDIE_RE, Health, Inventory
from dra_driver.discovery import npu_smi
from dra_driver.errors import ErrorCode, InvalidInput, Unavailable

DATA = Path(__file__).resolve().parents[1] / "data" / "npu-smi"
FAKE = DATA / "fake_npu_smi.py"


class Expected(NamedTuple):
    """One die, compactly: (phy, logic, card, chip, die_index, model, bus, memory MiB, health)."""

    phy: int
    logic: int
    card: int
    chip: int
    die_index: int
    model: str
    bus: str
    memory_mib: int
    health: Health


OK, BAD = Health.HEALTHY, Health.UNHEALTHY
A2_BUSES = ["C1", "C2", "81", "82", "01", "02", "41", "42"]

SAMPLES = [
    pytest.param(
        "a2-8x910b4",
        npu_smi.SmiFormat.A2,
        "24.1.rc3",
        "7.5.0.1.129",
        [
            Expected(i, i, i, 0, 0, "910B4", f"0000:{A2_BUSES[i]}:00.0", 32768, BAD if i == 5 else OK)
            for i in range(8)
        ],
        "",
        id="a2-8x910b4-one-warning",
    ),
    pytest.param(
        "a3-2x2dies",
        npu_smi.SmiFormat.A3,
        "25.0.rc1.1",
        "7.7.0.1.231",
        [
            Expected(0, 0, 0, 0, 0, "Ascend910", "0000:9D:00.0", 65536, OK),
            Expected(1, 1, 0, 1, 1, "Ascend910", "0000:9F:00.0", 65536, OK),
            Expected(2, 2, 1, 0, 0, "Ascend910", "0000:99:00.0", 65536, OK),
            Expected(3, 3, 1, 1, 1, "Ascend910", "0000:9B:00.0", 65536, BAD),
        ],
        "9392",
        id="a3-two-modules-one-critical",
    ),
    pytest.param(
        "310p3-duo",
        npu_smi.SmiFormat.P310,
        "24.1.rc2",
        "7.5.0.1.129",
        [
            Expected(0, 0, 1, 0, 0, "310P3", "0000:01:00.0", 21534, OK),
            Expected(1, 1, 1, 1, 0, "310P3", "0000:02:00.0", 21527, OK),
        ],
        "",
        id="310p3-duo-one-card-two-chips",
    ),
]


def read(sample: str, name: str) -> str:
    return (DATA / sample / name).read_text()


def boards_of(sample: str) -> dict[tuple[int, int], npu_smi.BoardInfo]:
    out = {}
    for path in sorted((DATA / sample).glob("board-*-*.txt")):
        _, npu, chip = path.stem.split("-")
        out[(int(npu), int(chip))] = npu_smi.parse_board(path.read_text())
    return out


def compact(inv: Inventory) -> list[Expected]:
    return [
        Expected(
            d.phy_id,
            d.logic_id,
            d.card_id,
            d.chip_id,
            d.die_index,
            d.model,
            d.pci_bus_id,
            d.memory_mib,
            d.health,
        )
        for d in inv.dies
    ]


def fake_npu_smi(tmp_path: Path, sample: str) -> str:
    """A real executable that prints the recorded outputs of ``sample`` (any argv npu-smi gets)."""
    exe = tmp_path / "npu-smi"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "{DATA / sample}" "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


# -- pure parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize(("sample", "fmt", "version", "firmware", "expected", "npu_name"), SAMPLES)
def test_parse_samples(
    sample: str, fmt: npu_smi.SmiFormat, version: str, firmware: str, expected: list[Expected], npu_name: str
) -> None:
    table = npu_smi.parse_info(read(sample, "info.txt"))
    assert table.format is fmt
    assert table.version == version
    boards = boards_of(sample)
    inv = npu_smi.build_inventory(
        table,
        boards=boards,
        logic_ids=npu_smi.parse_logic_ids(read(sample, "info-m.txt")),
        numa_nodes={expected[0].bus.lower(): 1},
    )
    assert compact(inv) == expected
    assert inv.driver_version == version and inv.firmware_version == firmware
    assert inv.source == "npu-smi"
    assert [d.numa_node for d in inv.dies] == [1] + [npu_smi.UNKNOWN_NUMA_NODE] * (len(expected) - 1)
    for die in inv.dies:
        assert VDIE_RE.match(die.vdie_id)
        assert die.vdie_id == boards[(die.card_id, die.chip_id)].vdie_id
        assert die.npu_name == npu_name
        assert die.aicore == die.chip_model.aicore


def test_health_text_is_kept_and_mapped() -> None:
    table = npu_smi.parse_info(read("a3-2x2dies", "info.txt"))
    assert [r.health_text for r in table.rows] == ["OK", "OK", "OK", "Critical"]
    assert [r.phy_id for r in table.rows] == [0, 1, 2, 3]
    a2 = npu_smi.parse_info(read("a2-8x910b4", "info.txt"))
    assert a2.rows[5].health_text == "Warning" and a2.rows[5].health is Health.UNHEALTHY
    assert all(r.phy_id is None for r in a2.rows)


def test_parse_board_a3_and_a2() -> None:
    a3 = npu_smi.parse_board(read("a3-2x2dies", "board-0-1.txt"))
    assert (a3.chip_name, a3.npu_name, a3.bus_id, a3.firmware_version) == (
        "Ascend910",
        "9392",
        "0000:9F:00.0",
        "7.7.0.1.231",
    )
    assert a3.vdie_id == "F611C2DF-8BB93476-B4312771-D0F15028-69323E6E"
    a2 = npu_smi.parse_board(read("a2-8x910b4", "board-3-0.txt"))
    assert (a2.chip_name, a2.npu_name) == ("910B4", "")


def test_logic_ids_skip_mcu_rows() -> None:
    ids = npu_smi.parse_logic_ids(read("a3-2x2dies", "info-m.txt"))
    assert ids == {(0, 0): 0, (0, 1): 1, (1, 0): 2, (1, 1): 3}


# -- malformed input ------------------------------------------------------------------------------

A2_INFO = read("a2-8x910b4", "info.txt")
A2_LINES = A2_INFO.splitlines()


def replace_line(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        pytest.param(
            read("unknown-format", "info.txt"),
            "info:5",
            "'| Chip  Phy-ID | Bus-Id | ...' (A3)",
            id="unknown-format",
        ),
        pytest.param("", "info", "expected a table header", id="empty"),
        pytest.param("command not found\n", "info", "expected a table header", id="not-a-table"),
        pytest.param("\n".join(A2_LINES[:6]) + "\n", "info", "no NPU rows found", id="header-only"),
        pytest.param("\n".join(A2_LINES[:7]) + "\n", "info", "no chip row", id="truncated-after-npu-row"),
        pytest.param(
            replace_line(A2_INFO, "| 0     910B4               | OK ", "| 0     910B4    x          | OK "),
            "info:7",
            "expected an NPU row",
            id="npu-row-extra-token",
        ),
        pytest.param(
            replace_line(
                A2_INFO,
                "| 0                         | 0000:C1:00.0  |",
                "| 0     0                   | 0000:C1:00.0  |",
            ),
            "info:8",
            "expected a A2 chip row '| <Chip> | <Bus-Id> | ...'",
            id="a2-chip-row-with-phy-column",
        ),
        pytest.param(
            replace_line(A2_INFO, "2858 / 32768         |", "2858                 |"),
            "info:8",
            "Memory-Usage(MB) and HBM-Usage(MB)",
            id="hbm-missing",
        ),
        pytest.param(
            replace_line(
                A2_INFO,
                "| 0                         | 0000:C1:00.0  |",
                "| 0                         | 0000:C1:00.0  | x |",
            ),
            "info:8",
            "expected 3 '|'-separated cells, got 4",
            id="extra-cell",
        ),
        pytest.param(
            "\n".join([*A2_LINES[:6], A2_LINES[7]]) + "\n",
            "info:7",
            "chip row without a preceding NPU row",
            id="orphan-chip-row",
        ),
        pytest.param(
            "\n".join([*A2_LINES[:7], A2_LINES[6]]) + "\n",
            "info:8",
            "expected a chip row with a PCI bus ID",
            id="two-npu-rows",
        ),
    ],
)
def test_bad_info(text: str, field: str, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        npu_smi.parse_info(text)
    assert info.value.code is ErrorCode.INVALID_NPU_SMI
    assert info.value.field == field
    assert message in info.value.message


BOARD = read("a2-8x910b4", "board-0-0.txt")


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        pytest.param("", "info -t board.Chip Name", "Chip Name", id="empty"),
        pytest.param(
            "\n".join(line for line in BOARD.splitlines() if "VDie" not in line),
            "info -t board.VDie ID",
            "expected a 'VDie ID",
            id="no-vdie",
        ),
        pytest.param(
            replace_line(BOARD, BOARD.split("VDie ID")[1].split(":")[1].split("\n")[0], " 42C711D4 20B03704"),
            "info -t board.VDie ID",
            "5 groups of 8 hex digits",
            id="short-vdie",
        ),
        pytest.param(
            replace_line(BOARD, "0000:C1:00.0", "C1:00.0"),
            "info -t board.PCIe Bus Info",
            "PCI bus ID",
            id="bad-bus",
        ),
    ],
)
def test_bad_board(text: str, field: str, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        npu_smi.parse_board(text)
    assert info.value.code is ErrorCode.INVALID_NPU_SMI
    assert info.value.field == field
    assert message in info.value.message


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        pytest.param("NPU ID  Chip ID\n0 0\n", "info -m", "expected a header", id="no-header"),
        pytest.param(
            "NPU ID Chip ID Chip Logic ID Chip Name\n", "info -m", "no chip with a logic ID", id="no-rows"
        ),
        pytest.param(
            "NPU ID Chip ID Chip Logic ID Chip Name\nzero 0 0 Ascend\n",
            "info -m:2",
            "expected 'NPU-ID",
            id="bad-row",
        ),
        pytest.param(
            "NPU ID Chip ID Chip Logic ID Chip Name\n0 0 x Ascend\n",
            "info -m:2",
            "logic ID or '-'",
            id="bad-logic",
        ),
    ],
)
def test_bad_logic_ids(text: str, field: str, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        npu_smi.parse_logic_ids(text)
    assert info.value.code is ErrorCode.INVALID_NPU_SMI
    assert info.value.field == field
    assert message in info.value.message


@pytest.mark.parametrize(
    ("info_text", "drop_board", "drop_logic", "field", "message"),
    [
        pytest.param(
            A2_INFO.replace("910B4", "910B9"),
            None,
            None,
            "info.rows[0].name",
            "unsupported chip name",
            id="unknown-model",
        ),
        pytest.param(A2_INFO, (3, 0), None, "info -t board -i 3 -c 0", "no board output", id="missing-board"),
        pytest.param(A2_INFO, None, (7, 0), "info -m", "no logic ID for NPU 7 chip 0", id="missing-logic"),
    ],
)
def test_bad_combination(
    info_text: str,
    drop_board: tuple[int, int] | None,
    drop_logic: tuple[int, int] | None,
    field: str,
    message: str,
) -> None:
    boards = boards_of("a2-8x910b4")
    logic = npu_smi.parse_logic_ids(read("a2-8x910b4", "info-m.txt"))
    boards.pop(drop_board or (-1, -1), None)
    logic.pop(drop_logic or (-1, -1), None)
    with pytest.raises(InvalidInput) as info:
        npu_smi.build_inventory(npu_smi.parse_info(info_text), boards=boards, logic_ids=logic, numa_nodes={})
    assert info.value.code is ErrorCode.INVALID_NPU_SMI
    assert info.value.field == field
    assert message in info.value.message


def test_duplicate_physical_id() -> None:
    text = read("a3-2x2dies", "info.txt").replace(
        "| 1     3                   |", "| 1     2                   |"
    )
    table = npu_smi.parse_info(text)
    logic = npu_smi.parse_logic_ids(read("a3-2x2dies", "info-m.txt"))
    with pytest.raises(
        InvalidInput, match="physical ID 2 of NPU 1 chip 1 is also used by NPU 1 chip 0"
    ) as info:
        npu_smi.build_inventory(table, boards=boards_of("a3-2x2dies"), logic_ids=logic, numa_nodes={})
    assert info.value.field == "info.rows[3].phyId"


# -- the real subprocess path ------------------------------------------------------------------------


@pytest.mark.parametrize(("sample", "fmt", "version", "firmware", "expected", "npu_name"), SAMPLES)
def test_discover_runs_npu_smi(
    tmp_path: Path,
    sample: str,
    fmt: npu_smi.SmiFormat,
    version: str,
    firmware: str,
    expected: list[Expected],
    npu_name: str,
) -> None:
    sysfs = tmp_path / "sys"
    numa_file = sysfs / "bus" / "pci" / "devices" / expected[-1].bus.lower() / "numa_node"
    numa_file.parent.mkdir(parents=True)
    numa_file.write_text("1\n")
    backend = npu_smi.NpuSmiDiscovery(fake_npu_smi(tmp_path, sample), sysfs=sysfs, timeout=60)
    inv = backend.discover()
    assert compact(inv) == expected
    assert (inv.driver_version, inv.firmware_version) == (version, firmware)
    assert inv.dies[-1].numa_node == 1
    assert inv.dies[0].numa_node == (1 if len(expected) == 1 else npu_smi.UNKNOWN_NUMA_NODE)


def test_from_config_without_inventory_uses_npu_smi(tmp_path: Path) -> None:
    backend = discovery.from_config(inventory=None, npu_smi=fake_npu_smi(tmp_path, "310p3-duo"))
    assert isinstance(backend, npu_smi.NpuSmiDiscovery)
    assert [d.model for d in backend.discover().dies] == ["310P3", "310P3"]


def test_discover_unknown_format_through_subprocess(tmp_path: Path) -> None:
    backend = npu_smi.NpuSmiDiscovery(fake_npu_smi(tmp_path, "unknown-format"), timeout=60)
    with pytest.raises(InvalidInput) as info:
        backend.discover()
    assert info.value.code is ErrorCode.INVALID_NPU_SMI


def test_nonzero_exit_is_unavailable_with_stderr(tmp_path: Path) -> None:
    # unknown-format has no info-m.txt, but fails earlier; use a dir with no files at all.
    backend = npu_smi.NpuSmiDiscovery(fake_npu_smi(tmp_path, "no-such-sample"), timeout=60)
    with pytest.raises(Unavailable, match="exited with status 1: Error: unsupported command") as info:
        backend.discover()
    assert info.value.field == "npu-smi"


def test_missing_executable_is_a_config_error(tmp_path: Path) -> None:
    backend = npu_smi.NpuSmiDiscovery(str(tmp_path / "absent-npu-smi"))
    with pytest.raises(InvalidInput, match="not found") as info:
        backend.discover()
    assert info.value.code is ErrorCode.INVALID_CONFIG


def test_timeout_is_unavailable_and_kills_the_child(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    exe = tmp_path / "hung-npu-smi"
    exe.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 300\n")
    exe.chmod(0o755)
    backend = npu_smi.NpuSmiDiscovery(str(exe), timeout=0.5)
    with pytest.raises(Unavailable, match=r"did not finish within 0.5s"):
        backend.discover()
    pid = int(pid_file.read_text())
    # subprocess.run kills and reaps the child on timeout: the pid no longer exists.
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_template_info_overrides_the_table_when_npu_smi_has_it(tmp_path: Path) -> None:
    from dra_driver import templates
    from flexnpu_testing import fake_npu_smi

    exe = fake_npu_smi.install(tmp_path / "smi", device_root=tmp_path / "root", samples=DATA / "a2-8x910b4")
    inv = npu_smi.NpuSmiDiscovery(str(exe), timeout=60).discover()
    assert dict(inv.templates) == {"910B4": templates.for_model("910B4")}
    fake_npu_smi.inject(tmp_path / "smi", "template-info", rc=0, stdout="something else\n")
    assert dict(npu_smi.NpuSmiDiscovery(str(exe), timeout=60).discover().templates) == {}


def test_without_template_info_the_table_is_used(tmp_path: Path) -> None:
    inv = npu_smi.NpuSmiDiscovery(fake_npu_smi(tmp_path, "a2-8x910b4"), timeout=60).discover()
    assert dict(inv.templates) == {}
