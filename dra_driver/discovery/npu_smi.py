"""Discovery on a real Ascend node, from ``npu-smi`` output.

Four commands (sample outputs of each in ``tests/unit/test_discovery_npu_smi.py``):

* ``npu-smi info`` - the chip table: NPU ID, name, health, chip, bus ID, memory. Three
  layouts: A2 (``| Chip | Bus-Id | ... HBM-Usage(MB) |``), A3 (``| Chip  Phy-ID | ...``, two
  rows per NPU) and 310P (``| Chip  Device | ... Memory-Usage(MB) |``, no HBM column);
* ``npu-smi info -m`` - NPU ID / Chip ID -> Chip Logic ID;
* ``npu-smi info -t board -i <NPU> -c <chip>`` - per chip: Chip Name, NPU Name (A3), VDie
  ID, PCIe bus, firmware version;
* ``npu-smi info -t template-info`` - the hard-split templates the chips offer (optional: the
  built-in table of ``dra_driver/templates.py`` is used when it fails).

The ``parse_*`` functions and :func:`build_inventory` are pure (text in, data out) and
raise :class:`InvalidInput` with code ``INVALID_NPU_SMI`` naming what was expected;
:class:`NpuSmiDiscovery` is the only code that runs processes or reads sysfs.

Physical IDs: taken from the Phy-ID (A3) or Device (310P) column; the A2 table has no such
column, and the physical ID of an A2 chip is its NPU ID (one chip per card).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from dra_driver import templates
from dra_driver.devices import CHIP_MODELS, PCI_BUS_RE, VDIE_RE, Die, Health, Inventory
from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput, Unavailable
from dra_driver.templates import Template

__all__ = [
    "BoardInfo",
    "ChipRow",
    "InfoTable",
    "NpuSmiDiscovery",
    "SmiFormat",
    "build_inventory",
    "parse_board",
    "parse_info",
    "parse_logic_ids",
]

log = logging.getLogger("flexnpu.discovery")

DEFAULT_TIMEOUT_SECONDS = 15.0
UNKNOWN_NUMA_NODE = -1

_PAIR_RE = re.compile(r"(\d+)\s*/\s*(\d+)")
_VERSION_RE = re.compile(r"Version:\s*(\S+)")
_EXPECTED_HEADER = (
    "a table header '| NPU  Name | Health | Power(W) ...' followed by "
    "'| Chip | Bus-Id | ...' (A2), '| Chip  Phy-ID | Bus-Id | ...' (A3) or '| Chip  Device | Bus-Id | ...' (310P)"
)


class SmiFormat(StrEnum):
    """Which ``npu-smi info`` layout a table uses."""

    A2 = "A2"
    A3 = "A3"
    P310 = "310P"


@dataclass(frozen=True, slots=True)
class ChipRow:
    """One chip (die) row pair of the ``npu-smi info`` table."""

    npu_id: int
    chip_id: int
    name: str
    health: Health
    health_text: str  # as printed: OK, Warning, Alarm, Critical, ...
    bus_id: str
    phy_id: int | None  # Phy-ID (A3) or Device (310P) column; None on A2
    memory_total_mib: int  # HBM total (A2/A3) or DDR total (310P)


@dataclass(frozen=True, slots=True)
class InfoTable:
    format: SmiFormat
    version: str  # npu-smi / driver version from the banner, "" if absent
    rows: tuple[ChipRow, ...]


@dataclass(frozen=True, slots=True)
class BoardInfo:
    """What ``npu-smi info -t board -i N -c C`` says about one chip."""

    chip_name: str
    vdie_id: str  # normalised: 5 upper-case groups joined by '-'
    npu_name: str = ""  # A3 only
    bus_id: str = ""
    firmware_version: str = ""


def _bad(field: str, message: str) -> InvalidInput:
    return InvalidInput(f"unexpected npu-smi output: {message}", code=ErrorCode.INVALID_NPU_SMI, field=field)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_info(text: str) -> InfoTable:
    """Parse the ``npu-smi info`` table (A2, A3 or 310P layout); the process table is ignored."""
    lines = text.splitlines()
    header = next(
        (
            i
            for i, line in enumerate(lines)
            if line.lstrip().startswith("|") and _cells(line)[0].split()[:2] == ["NPU", "Name"]
        ),
        None,
    )
    if header is None or header + 1 >= len(lines):
        raise _bad("info", f"expected {_EXPECTED_HEADER}")
    version_match = _VERSION_RE.search("\n".join(lines[:header]))
    second = _cells(lines[header + 1])
    fmt = _format_of(second)
    if fmt is None:
        raise _bad(f"info:{header + 2}", f"expected {_EXPECTED_HEADER}, got {lines[header + 1].strip()!r}")
    rows: list[ChipRow] = []
    pending: tuple[int, str, str] | None = None  # NPU row: npu id, name, health text
    for lineno, line in enumerate(lines[header + 2 :], start=header + 3):
        stripped = line.strip()
        if not stripped.startswith("|"):
            continue  # separators (+---+, +===+) and blank lines
        cells = _cells(stripped)
        if cells[0].split()[:2] == ["NPU", "Chip"] or "Process id" in stripped:
            break  # the process table follows the chip table
        if len(cells) != 3:
            raise _bad(f"info:{lineno}", f"expected 3 '|'-separated cells, got {len(cells)}: {stripped!r}")
        where = f"info:{lineno}"
        if PCI_BUS_RE.match(cells[1]):
            if pending is None:
                raise _bad(where, f"chip row without a preceding NPU row: {stripped!r}")
            rows.append(_chip_row(fmt, pending, cells, where))
            pending = None
        else:
            if pending is not None:
                raise _bad(
                    where, f"expected a chip row with a PCI bus ID after the NPU row, got {stripped!r}"
                )
            pending = _npu_row(cells, where)
    if pending is not None:
        raise _bad("info", "the last NPU row has no chip row")
    if not rows:
        raise _bad("info", "no NPU rows found under the table header")
    return InfoTable(format=fmt, version=version_match.group(1) if version_match else "", rows=tuple(rows))


def parse_logic_ids(text: str) -> dict[tuple[int, int], int]:
    """Parse ``npu-smi info -m``: (NPU ID, Chip ID) -> Chip Logic ID; MCU rows ('-') are skipped."""
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if "NPU ID" in line and "Chip Logic ID" in line), None)
    if header is None:
        raise _bad("info -m", "expected a header 'NPU ID  Chip ID  Chip Logic ID  Chip Name'")
    out: dict[tuple[int, int], int] = {}
    for lineno, line in enumerate(lines[header + 1 :], start=header + 2):
        tokens = line.split()
        if not tokens:
            continue
        if len(tokens) < 3 or not (tokens[0].isdigit() and tokens[1].isdigit()):
            raise _bad(f"info -m:{lineno}", f"expected 'NPU-ID CHIP-ID LOGIC-ID NAME', got {line.strip()!r}")
        if tokens[2] == "-":
            continue
        if not tokens[2].isdigit():
            raise _bad(f"info -m:{lineno}", f"expected a logic ID or '-', got {tokens[2]!r}")
        out[(int(tokens[0]), int(tokens[1]))] = int(tokens[2])
    if not out:
        raise _bad("info -m", "no chip with a logic ID found")
    return out


def parse_board(text: str, *, where: str = "info -t board") -> BoardInfo:
    """Parse ``npu-smi info -t board -i N -c C`` key/value lines (VDie ID is required)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    chip_name = fields.get("Chip Name", "")
    if not chip_name:
        raise _bad(f"{where}.Chip Name", "expected a 'Chip Name : <name>' line")
    raw_vdie = fields.get("VDie ID")
    if raw_vdie is None:
        raise _bad(f"{where}.VDie ID", "expected a 'VDie ID : XXXXXXXX XXXXXXXX ...' line")
    vdie_id = "-".join(raw_vdie.upper().split())
    if not VDIE_RE.match(vdie_id):
        raise _bad(f"{where}.VDie ID", f"expected 5 groups of 8 hex digits, got {raw_vdie!r}")
    bus_id = fields.get("PCIe Bus Info", "")
    if bus_id and not PCI_BUS_RE.match(bus_id):
        raise _bad(f"{where}.PCIe Bus Info", f"expected a PCI bus ID like 0000:C1:00.0, got {bus_id!r}")
    return BoardInfo(
        chip_name=chip_name,
        vdie_id=vdie_id,
        npu_name=fields.get("NPU Name", ""),
        bus_id=bus_id,
        firmware_version=fields.get("Firmware Version", ""),
    )


def build_inventory(
    table: InfoTable,
    *,
    boards: Mapping[tuple[int, int], BoardInfo],
    logic_ids: Mapping[tuple[int, int], int],
    numa_nodes: Mapping[str, int],
) -> Inventory:
    """Combine the parsed outputs into dies, sorted by physical ID (pure).

    ``numa_nodes`` maps a lower-case PCI bus ID to its NUMA node; a missing bus gets
    ``UNKNOWN_NUMA_NODE`` (-1).
    """
    dies: list[Die] = []
    seen_phy: dict[int, str] = {}
    for i, row in enumerate(table.rows):
        where = f"info.rows[{i}]"
        key = (row.npu_id, row.chip_id)
        model = CHIP_MODELS.get(row.name)
        if model is None:
            known = ", ".join(sorted(CHIP_MODELS))
            raise _bad(f"{where}.name", f"unsupported chip name {row.name!r} (supported: {known})")
        board = boards.get(key)
        if board is None:
            raise _bad(f"info -t board -i {row.npu_id} -c {row.chip_id}", "no board output for this chip")
        logic_id = logic_ids.get(key)
        if logic_id is None:
            raise _bad("info -m", f"no logic ID for NPU {row.npu_id} chip {row.chip_id}")
        phy_id = row.phy_id if row.phy_id is not None else row.npu_id
        label = f"NPU {row.npu_id} chip {row.chip_id}"
        if phy_id in seen_phy:
            raise _bad(
                f"{where}.phyId", f"physical ID {phy_id} of {label} is also used by {seen_phy[phy_id]}"
            )
        seen_phy[phy_id] = label
        dies.append(
            Die(
                vdie_id=board.vdie_id,
                model=model.name,
                card_id=row.npu_id,
                chip_id=row.chip_id,
                phy_id=phy_id,
                logic_id=logic_id,
                pci_bus_id=row.bus_id,
                numa_node=numa_nodes.get(row.bus_id.lower(), UNKNOWN_NUMA_NODE),
                memory_mib=row.memory_total_mib or model.memory_mib,
                aicore=model.aicore,
                aicpu=model.aicpu,
                health=row.health,
                die_index=row.chip_id % model.dies_per_chip,
                npu_name=board.npu_name,
            )
        )
    firmware = next((b.firmware_version for b in boards.values() if b.firmware_version), "")
    return Inventory(
        dies=tuple(sorted(dies, key=lambda d: d.phy_id)),
        driver_version=table.version,
        firmware_version=firmware,
        source="npu-smi",
    )


class NpuSmiDiscovery:
    """Discovery by running ``npu-smi`` (each call bounded by ``timeout`` seconds).

    **Parameters:**
    * executable - the npu-smi program (a name on PATH or a path; tests pass a fake).
    * timeout - seconds per npu-smi call; a timeout raises Unavailable.
    * sysfs - where to read ``bus/pci/devices/<bus>/numa_node`` (``/sys`` on a node).
    """

    def __init__(
        self,
        executable: str = "npu-smi",
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        sysfs: Path = Path("/sys"),
        runner: Callable[[list[str], float], subprocess.CompletedProcess[str]] | None = None,
    ) -> None:
        self.executable = executable
        self.timeout = timeout
        self.sysfs = sysfs
        self._runner = runner or _run

    def discover(self) -> Inventory:
        table = parse_info(self.run("info"))
        logic_ids = parse_logic_ids(self.run("info", "-m"))
        boards: dict[tuple[int, int], BoardInfo] = {}
        for row in table.rows:
            args = ("info", "-t", "board", "-i", str(row.npu_id), "-c", str(row.chip_id))
            boards[(row.npu_id, row.chip_id)] = parse_board(self.run(*args), where=" ".join(args[1:]))
        numa = {row.bus_id.lower(): self.numa_node(row.bus_id) for row in table.rows}
        inventory = build_inventory(table, boards=boards, logic_ids=logic_ids, numa_nodes=numa)
        return dataclasses.replace(inventory, templates=self.template_overrides(inventory))

    def template_overrides(self, inventory: Inventory) -> dict[str, tuple[Template, ...]]:
        """Templates from ``npu-smi info -t template-info`` for the node's chip model.

        Only for a node with one chip model (all NPUs of a server have the same spec). When the
        command fails (a driver without it) or prints an unknown format, the built-in table
        (``dra_driver/templates.py``) is used and the reason is logged.
        """
        models = sorted({d.model for d in inventory.dies})
        if len(models) != 1:
            return {}
        try:
            parsed = templates.parse_template_info(self.run("info", "-t", "template-info"), model=models[0])
        except FlexNPUError as err:
            log.info("npu-smi template-info not used, built-in template table instead: %s", err)
            return {}
        return {models[0]: parsed}

    def run(self, *args: str) -> str:
        """Run npu-smi with ``args``; return stdout or raise InvalidInput/Unavailable."""
        return run_npu_smi(self._runner, self.executable, args, timeout=self.timeout, code=ErrorCode.INTERNAL)

    def numa_node(self, bus_id: str) -> int:
        path = self.sysfs / "bus" / "pci" / "devices" / bus_id.lower() / "numa_node"
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return UNKNOWN_NUMA_NODE

    def __repr__(self) -> str:
        return f"NpuSmiDiscovery({self.executable!r})"


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL
    )


def _format_of(cells: list[str]) -> SmiFormat | None:
    if len(cells) != 3 or cells[1] != "Bus-Id":
        return None
    first = cells[0].split()
    if first == ["Chip", "Phy-ID"]:
        return SmiFormat.A3
    if first == ["Chip", "Device"]:
        return SmiFormat.P310
    if first == ["Chip"] and "HBM-Usage" in cells[2]:
        return SmiFormat.A2
    return None


def _npu_row(cells: list[str], where: str) -> tuple[int, str, str]:
    tokens = cells[0].split()
    if len(tokens) != 2 or not tokens[0].isdigit():
        raise _bad(where, f"expected an NPU row '| <NPU ID> <Name> | <Health> | ...', got cells {cells!r}")
    health = cells[1].split()
    if len(health) != 1:
        raise _bad(where, f"expected a health word (OK, Warning, Alarm, Critical), got {cells[1]!r}")
    return int(tokens[0]), tokens[1], health[0]


def _chip_row(fmt: SmiFormat, npu: tuple[int, str, str], cells: list[str], where: str) -> ChipRow:
    npu_id, name, health_text = npu
    tokens = cells[0].split()
    want = 1 if fmt is SmiFormat.A2 else 2
    if len(tokens) != want or not all(t.isdigit() for t in tokens):
        shape = "<Chip>" if want == 1 else ("<Chip> <Phy-ID>" if fmt is SmiFormat.A3 else "<Chip> <Device>")
        raise _bad(where, f"expected a {fmt} chip row '| {shape} | <Bus-Id> | ...', got {cells[0]!r}")
    pairs = _PAIR_RE.findall(cells[2])
    need = 1 if fmt is SmiFormat.P310 else 2
    if len(pairs) < need:
        column = "Memory-Usage(MB)" if fmt is SmiFormat.P310 else "Memory-Usage(MB) and HBM-Usage(MB)"
        raise _bad(where, f"expected {column} as 'used / total', got {cells[2]!r}")
    return ChipRow(
        npu_id=npu_id,
        chip_id=int(tokens[0]),
        name=name,
        health=Health.HEALTHY if health_text == "OK" else Health.UNHEALTHY,
        health_text=health_text,
        bus_id=cells[1],
        phy_id=int(tokens[1]) if len(tokens) == 2 else None,
        memory_total_mib=int(pairs[-1][1]),
    )


Runner = Callable[[list[str], float], "subprocess.CompletedProcess[str]"]


def run_npu_smi(
    runner: Runner, executable: str, args: tuple[str, ...], *, timeout: float, code: ErrorCode
) -> str:
    """Run ``executable args`` through ``runner``; its stdout, or InvalidInput (not installed) /
    Unavailable with ``code`` (timeout, cannot run, non-zero exit). The one npu-smi runner of the
    driver: discovery and the vNPU backend (``dra_driver/vnpu/npu_smi.py``) both use it."""
    argv = [executable, *args]
    command = " ".join(argv)[:MAX_QUOTED_COMMAND]
    try:
        done = runner(argv, timeout)
    except FileNotFoundError as exc:
        raise InvalidInput(
            f"npu-smi executable {executable[:MAX_QUOTED_COMMAND]!r} not found (set --npu-smi or --inventory)",
            code=ErrorCode.INVALID_CONFIG,
            field="npu-smi",
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise Unavailable(
            f"{command!r} did not finish within {timeout:g}s", code=code, field="npu-smi"
        ) from exc
    except OSError as exc:
        raise Unavailable(f"cannot run {command!r}: {exc}", code=code, field="npu-smi") from exc
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip()[-MAX_QUOTED_COMMAND:]
        raise Unavailable(
            f"{command!r} exited with status {done.returncode}: {detail}", code=code, field="npu-smi"
        )
    return done.stdout


MAX_QUOTED_COMMAND = 200
