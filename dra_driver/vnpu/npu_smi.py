"""The ``npu-smi`` vNPU backend of a real node, and the pure parsers of what npu-smi prints.

Commands (card = NPU ID ``-i``, chip = ``-c``):

* ``npu-smi set -t create-vnpu -i <card> -c <chip> -f <template> -v <vnpu_id>``
* ``npu-smi set -t destroy-vnpu -i <card> -c <chip> -v <vnpu_id>``
* ``npu-smi info -t info-vnpu -i <card> -c <chip>`` - a resource summary, then a line
  ``Total number of vnpu: N`` and a table with the columns ``Vnpu ID``, ``Vgroup ID``,
  ``Container ID``, ``Status`` (1 = used by a container) and ``Template Name``, one row per vNPU;
* ``npu-smi info -t vnpu-mode`` - a line ``vnpu-mode : container`` (or ``0``; ``vm``/``1``
  otherwise).

:func:`parse_info_vnpu` and :func:`parse_vnpu_mode` are pure and raise InvalidInput
``InvalidNpuSmiOutput`` naming what they expected. :class:`NpuSmiVnpus` runs the commands and
verifies every change by listing again: a create whose vNPU does not appear with its template is
destroyed again (if it appeared at all) before the error is raised.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable

from dra_driver.devices import Die, Inventory
from dra_driver.discovery import npu_smi as discovery_npu_smi
from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput, StateError
from dra_driver.templates import Template
from dra_driver.vnpu import Vnpu, check_template

__all__ = ["NpuSmiVnpus", "parse_info_vnpu", "parse_vnpu_mode"]

DEFAULT_TIMEOUT_SECONDS = 15.0
MAX_QUOTED = 200

_TOTAL = re.compile(r"Total number of vnpu\s*:\s*(\d+)", re.IGNORECASE)
_COLUMNS = ("vnpu id", "vgroup id", "container id", "status", "template name")

Runner = Callable[[list[str], float], subprocess.CompletedProcess[str]]


def parse_info_vnpu(text: str, *, die: Die) -> tuple[Vnpu, ...]:
    """The vNPUs of one chip from ``npu-smi info -t info-vnpu -i <card> -c <chip>`` (pure)."""
    where = f"info -t info-vnpu -i {die.card_id} -c {die.chip_id}"
    total_match = _TOTAL.search(text)
    if total_match is None:
        raise _bad(where, "no line 'Total number of vnpu: N'")
    total = int(total_match.group(1))
    header: list[str] | None = None
    out: list[Vnpu] = []
    for raw in text.splitlines():
        if "|" not in raw:
            continue
        cells = [c.strip() for c in raw.strip().strip("|").split("|")]
        lowered = [c.lower() for c in cells]
        if header is None and all(col in lowered for col in _COLUMNS):
            header = lowered
            continue
        if header is None or not cells or not cells[0].isdigit():
            continue
        if len(cells) != len(header):
            raise _bad(where, f"row {raw.strip()[:MAX_QUOTED]!r} has {len(cells)} of {len(header)} columns")
        row = dict(zip(header, cells, strict=True))
        try:
            vnpu_id, vgroup, status = int(row["vnpu id"]), int(row["vgroup id"]), int(row["status"])
        except ValueError:
            raise _bad(
                where, f"row {raw.strip()[:MAX_QUOTED]!r}: Vnpu ID, Vgroup ID and Status must be integers"
            ) from None
        if not row["template name"].startswith("vir"):
            raise _bad(where, f"row {raw.strip()[:MAX_QUOTED]!r}: template {row['template name'][:64]!r}")
        out.append(
            Vnpu(
                vnpu_id=vnpu_id,
                phy_id=die.phy_id,
                card_id=die.card_id,
                chip_id=die.chip_id,
                template=row["template name"],
                vgroup=vgroup,
                in_use=status == 1,
            )
        )
    if total and header is None:
        raise _bad(where, f"{total} vNPU(s) announced but no table with the columns {', '.join(_COLUMNS)}")
    if len(out) != total:
        raise _bad(where, f"{total} vNPU(s) announced, {len(out)} row(s) found")
    return tuple(sorted(out, key=lambda v: v.vnpu_id))


def parse_vnpu_mode(text: str) -> str:
    """``container`` or ``vm`` from ``npu-smi info -t vnpu-mode`` (pure)."""
    for raw in text.splitlines():
        key, sep, value = raw.replace("|", " ").partition(":")
        if sep and key.strip().lower().replace(" ", "-").replace("_", "-") == "vnpu-mode":
            v = value.strip().lower()
            if v in ("0", "container", "docker"):
                return "container"
            if v in ("1", "vm"):
                return "vm"
            raise _bad("info -t vnpu-mode", f"unknown vnpu-mode {value.strip()[:64]!r}")
    raise _bad("info -t vnpu-mode", "no line 'vnpu-mode : container|vm'")


class NpuSmiVnpus:
    """:class:`~dra_driver.vnpu.VnpuManager` that runs ``npu-smi`` (each call bounded by ``timeout``)."""

    def __init__(
        self,
        executable: str,
        inventory: Inventory,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        runner: Runner | None = None,
    ) -> None:
        self.executable = executable
        self.inventory = inventory
        self.timeout = timeout
        self._runner = runner or _run

    def list(self) -> tuple[Vnpu, ...]:
        out: list[Vnpu] = []
        for die in sorted(self.inventory.dies, key=lambda d: d.phy_id):
            out += self._list_die(die)
        return tuple(sorted(out, key=lambda v: v.vnpu_id))

    def create(self, die: Die, template: Template, vnpu_id: int) -> Vnpu:
        check_template(die, template.name, self.inventory)
        present = self._list_die(die)
        if any(v.vnpu_id == vnpu_id for v in present):
            raise StateError(
                f"die {die.phy_id}: vNPU ID {vnpu_id} already exists",
                code=ErrorCode.VNPU_ID_IN_USE,
                field="vnpuID",
            )
        args = ["set", "-t", "create-vnpu", "-i", str(die.card_id), "-c", str(die.chip_id)]
        args += ["-f", template.name, "-v", str(vnpu_id)]
        try:
            self._run(*args)
        except FlexNPUError as failed:
            self._undo(die, vnpu_id)
            raise failed
        made = next((v for v in self._list_die(die) if v.vnpu_id == vnpu_id), None)
        if made is None or made.template != template.name:
            self._undo(die, vnpu_id)
            raise StateError(
                f"die {die.phy_id}: npu-smi reported vNPU {vnpu_id} ({template.name}) created, but info-vnpu "
                f"shows {made.template if made else 'nothing'}",
                code=ErrorCode.VNPU_FAILED,
                field="vnpuID",
            )
        return made

    def destroy(self, die: Die, vnpu_id: int) -> bool:
        if not any(v.vnpu_id == vnpu_id for v in self._list_die(die)):
            return False
        try:
            self._destroy(die, vnpu_id)
        except FlexNPUError:
            if any(v.vnpu_id == vnpu_id for v in self._list_die(die)):
                raise
        if any(v.vnpu_id == vnpu_id for v in self._list_die(die)):
            raise StateError(
                f"die {die.phy_id}: npu-smi reported vNPU {vnpu_id} destroyed, but info-vnpu still lists it",
                code=ErrorCode.VNPU_FAILED,
                field="vnpuID",
            )
        return True

    def check_prerequisites(self, die: Die) -> None:
        mode = parse_vnpu_mode(self._run("info", "-t", "vnpu-mode"))
        if mode != "container":
            raise StateError(
                f"die {die.phy_id}: the node is in vNPU mode {mode!r}; run `npu-smi set -t vnpu-mode -d 0` (container)",
                code=ErrorCode.VNPU_MODE,
                field="vnpu-mode",
            )

    def _destroy(self, die: Die, vnpu_id: int) -> None:
        self._run(
            "set", "-t", "destroy-vnpu", "-i", str(die.card_id), "-c", str(die.chip_id), "-v", str(vnpu_id)
        )

    def _list_die(self, die: Die) -> tuple[Vnpu, ...]:
        text = self._run("info", "-t", "info-vnpu", "-i", str(die.card_id), "-c", str(die.chip_id))
        return parse_info_vnpu(text, die=die)

    def _undo(self, die: Die, vnpu_id: int) -> None:
        """After a failed create: destroy the vNPU if it appeared anyway (nothing half-made)."""
        try:
            if any(v.vnpu_id == vnpu_id for v in self._list_die(die)):
                self._destroy(die, vnpu_id)
        except FlexNPUError:
            pass  # the original error is the one to report; the sweep retries the orphan

    def _run(self, *args: str) -> str:
        return discovery_npu_smi.run_npu_smi(
            self._runner, self.executable, args, timeout=self.timeout, code=ErrorCode.VNPU_FAILED
        )

    def __repr__(self) -> str:
        return f"NpuSmiVnpus({self.executable!r})"


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL
    )


def _bad(where: str, message: str) -> InvalidInput:
    return InvalidInput(f"npu-smi {where}: {message}", code=ErrorCode.INVALID_NPU_SMI, field="npu-smi")
