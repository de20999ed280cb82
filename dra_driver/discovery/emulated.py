"""The emulated inventory: a YAML or JSON file that describes a node's NPUs.

It is the discovery backend on machines without NPUs (CI, kind clusters, tests). The file
names chips by model and card; everything else has a deterministic default derived from
node-independent seeds (card and chip index), so the same file always yields the same
dies. The format is documented field by field in ``docs/inventory.md``.

:func:`parse_inventory` is pure (a decoded document in, an :class:`Inventory` out, or an
:class:`InvalidInput` naming the file and the field path); :func:`load_inventory` and
:class:`EmulatedDiscovery` read the file. Nothing here creates device nodes: that is
:mod:`flexnpu_testing.devroot`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from dra_driver.devices import CHIP_MODELS, PCI_BUS_RE, VDIE_RE, ChipModel, Die, DieMode, Health, Inventory
from dra_driver.errors import ErrorCode, InvalidInput

__all__ = ["EmulatedDiscovery", "load_inventory", "parse_inventory"]

MAX_CARD_ID = 63  # mind-cluster's devmanager: at most 64 cards per node
MAX_CHIP_INDEX = 3  # mind-cluster: HiAIMaxDeviceNum = 4 chips per card

_TOP_FIELDS = {"driverVersion": str, "firmwareVersion": str, "seed": str, "chips": list}
# Fields that may describe every die of a chip (chip level) or one die (under dies[]).
_SHARED_FIELDS = {
    "numaNode": int,
    "memoryMiB": int,
    "aicore": int,
    "aicpu": int,
    "health": str,
    "mode": str,
}
# Fields that identify one die: at chip level only on single-die models.
_ID_FIELDS = {"phyId": int, "logicId": int, "vdieId": str, "busId": str}
_CHIP_FIELDS = (
    {"model": str, "card": int, "chip": int, "npuName": str, "dies": list} | _SHARED_FIELDS | _ID_FIELDS
)
_DIE_FIELDS = _SHARED_FIELDS | _ID_FIELDS
_TYPE_NAMES = {int: "an integer", str: "a string", list: "a list", dict: "a mapping"}


class EmulatedDiscovery:
    """Discovery backed by an emulated inventory file, re-read on every call.

    **Parameters:**
    * path - the YAML (``.yaml``/``.yml``) or JSON (``.json``) inventory file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def discover(self) -> Inventory:
        return load_inventory(self.path)

    def __repr__(self) -> str:
        return f"EmulatedDiscovery({str(self.path)!r})"


def load_inventory(path: Path) -> Inventory:
    """Read and validate an inventory file; errors name the file and the field path."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(
            f"cannot read inventory file {path}: {exc.strerror or exc}", code=ErrorCode.INVALID_INVENTORY
        ) from exc
    try:
        doc: object = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        raise InvalidInput(
            f"inventory file {path} is not valid {kind}: {exc}", code=ErrorCode.INVALID_INVENTORY
        ) from exc
    return parse_inventory(doc, source=str(path))


def parse_inventory(doc: object, *, source: str) -> Inventory:
    """Validate a decoded inventory document and derive every die (pure).

    ``source`` names the file in error messages and becomes ``Inventory.source`` as
    ``emulated:<source>``. Dies come out sorted by physical ID.
    """
    return _Parser(source).parse(doc)


@dataclass(slots=True)
class _DieSpec:
    """One die before defaults for IDs are filled in."""

    path: str  # field path of the chip (or die) entry, for duplicate errors
    model: ChipModel
    card: int
    chip: int  # package index on the card
    die_index: int
    npu_name: str
    fields: dict[str, object]  # explicit values: chip-level merged with die-level


class _Parser:
    """Validates one document; every error names `source` and a field path."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str | None, message: str) -> InvalidInput:
        return InvalidInput(
            f"inventory file {self.source}: {message}", code=ErrorCode.INVALID_INVENTORY, field=field
        )

    def parse(self, doc: object) -> Inventory:
        top = self.mapping(doc, None, _TOP_FIELDS, required=("chips",))
        chips = top["chips"]
        assert isinstance(chips, list)
        if not chips:
            raise self.fail("chips", "at least one chip is required")
        seed = str(top.get("seed", ""))
        specs: list[_DieSpec] = []
        used_chips: dict[int, set[int]] = {}
        explicit_chips = self.explicit_chip_indexes(chips)
        for i, raw in enumerate(chips):
            specs.extend(self.chip_specs(raw, f"chips[{i}]", used_chips, explicit_chips))
        dies, modes = self.build_dies(specs, seed)
        return Inventory(
            dies=tuple(sorted(dies, key=lambda d: d.phy_id)),
            driver_version=str(top.get("driverVersion", "")),
            firmware_version=str(top.get("firmwareVersion", "")),
            source=f"emulated:{self.source}",
            die_modes=modes,
        )

    # -- structure -------------------------------------------------------------------------------

    def mapping(
        self,
        raw: object,
        path: str | None,
        schema: Mapping[str, type],
        *,
        required: Sequence[str] = (),
    ) -> dict[str, object]:
        where = path or "the top level"
        if not isinstance(raw, dict):
            raise self.fail(path, f"{where} must be a mapping, got {_kind(raw)}")
        for key in raw:
            if key not in schema:
                known = ", ".join(sorted(schema))
                raise self.fail(_join(path, str(key)), f"unknown field {key!r} (known: {known})")
        for key in required:
            if key not in raw:
                raise self.fail(_join(path, key), f"missing required field {key!r}")
        out: dict[str, object] = {}
        for key, value in raw.items():
            want = schema[key]
            ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
            if not ok:
                hint = " (quote IDs in YAML)" if want is str and not isinstance(value, list | dict) else ""
                raise self.fail(_join(path, key), f"expected {_TYPE_NAMES[want]}, got {_kind(value)}{hint}")
            out[key] = value
        return out

    def explicit_chip_indexes(self, chips: list[object]) -> dict[int, set[int]]:
        """Chip indexes given explicitly per card, so defaults can step around them."""
        out: dict[int, set[int]] = {}
        for raw in chips:
            if isinstance(raw, dict):
                card, chip = raw.get("card"), raw.get("chip")
                if isinstance(card, int) and isinstance(chip, int):
                    out.setdefault(card, set()).add(chip)
        return out

    def chip_specs(
        self,
        raw: object,
        path: str,
        used_chips: dict[int, set[int]],
        explicit_chips: Mapping[int, set[int]],
    ) -> list[_DieSpec]:
        entry = self.mapping(raw, path, _CHIP_FIELDS, required=("model", "card"))
        name = entry["model"]
        assert isinstance(name, str)
        model = CHIP_MODELS.get(name)
        if model is None:
            known = ", ".join(sorted(CHIP_MODELS))
            raise self.fail(f"{path}.model", f"unknown model {name!r} (known: {known})")
        card = self.int_in(entry["card"], f"{path}.card", 0, MAX_CARD_ID)
        used = used_chips.setdefault(card, set())
        if "chip" in entry:
            chip = self.int_in(entry["chip"], f"{path}.chip", 0, MAX_CHIP_INDEX)
            if chip in used:
                raise self.fail(f"{path}.chip", f"duplicate chip {chip} on card {card}")
        else:
            taken = used | explicit_chips.get(card, set())
            chip = next(c for c in range(MAX_CHIP_INDEX + 2) if c not in taken)
            if chip > MAX_CHIP_INDEX:
                raise self.fail(f"{path}.card", f"card {card} has more than {MAX_CHIP_INDEX + 1} chips")
        used.add(chip)
        if model.dies_per_chip > 1:
            for key in _ID_FIELDS:
                if key in entry:
                    raise self.fail(
                        f"{path}.{key}",
                        f"model {model.name} has {model.dies_per_chip} dies per chip; set {key} under dies[]",
                    )
        shared = {k: v for k, v in entry.items() if k in _DIE_FIELDS}
        raw_dies = entry.get("dies")
        die_entries: list[dict[str, object]] = [{} for _ in range(model.dies_per_chip)]
        if raw_dies is not None:
            assert isinstance(raw_dies, list)
            if len(raw_dies) != model.dies_per_chip:
                raise self.fail(
                    f"{path}.dies",
                    f"model {model.name} has {model.dies_per_chip} die(s) per chip, got {len(raw_dies)} entries",
                )
            die_entries = [self.mapping(d, f"{path}.dies[{j}]", _DIE_FIELDS) for j, d in enumerate(raw_dies)]
        npu_name = str(entry.get("npuName", ""))
        specs = []
        for j, die_fields in enumerate(die_entries):
            die_path = f"{path}.dies[{j}]" if raw_dies is not None else path
            fields = {**shared, **die_fields}
            # Remember where each explicit value came from, for precise error paths.
            origins = {k: (die_path if k in die_fields else path) for k in fields}
            self.check_values(fields, origins)
            specs.append(_DieSpec(die_path, model, card, chip, j, npu_name, fields))
        return specs

    def check_values(self, fields: Mapping[str, object], origins: Mapping[str, str]) -> None:
        for key, value in fields.items():
            where = f"{origins[key]}.{key}"
            if key in ("phyId", "logicId", "numaNode", "aicpu"):
                self.int_in(value, where, 0, None)
            elif key in ("memoryMiB", "aicore"):
                self.int_in(value, where, 1, None)
            elif key == "health":
                allowed = [h.value for h in Health]
                if value not in allowed:
                    raise self.fail(where, f"health {value!r} is not one of {', '.join(allowed)}")
            elif key == "mode":
                allowed = [m.value for m in DieMode]
                if value not in allowed:
                    raise self.fail(where, f"mode {value!r} is not one of {', '.join(allowed)}")
            elif key == "vdieId":
                if not (isinstance(value, str) and VDIE_RE.match(value)):
                    raise self.fail(
                        where,
                        f"VDie ID {value!r} is not 5 groups of 8 upper-case hex digits joined by '-' "
                        "(e.g. 185011D4-21104518-A0C4ED94-14CC040A-56102003)",
                    )
            elif key == "busId" and not (isinstance(value, str) and PCI_BUS_RE.match(value)):
                raise self.fail(where, f"PCI bus ID {value!r} is not of the form 0000:C1:00.0")

    def int_in(self, value: object, where: str, low: int, high: int | None) -> int:
        assert isinstance(value, int)
        if value < low or (high is not None and value > high):
            if low == 1 and high is None:
                raise self.fail(where, f"must be positive, got {value}")
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise self.fail(where, f"must be {bound}, got {value}")
        return value

    # -- defaults and uniqueness ------------------------------------------------------------------

    def build_dies(self, specs: list[_DieSpec], seed: str) -> tuple[list[Die], dict[int, DieMode]]:
        phy_ids = _fill_sequential([s.fields.get("phyId") for s in specs])
        logic_ids = _fill_sequential([s.fields.get("logicId") for s in specs])
        seen: dict[str, dict[object, str]] = {"phyId": {}, "logicId": {}, "vdieId": {}, "busId": {}}
        dies: list[Die] = []
        modes: dict[int, DieMode] = {}
        for spec, phy_id, logic_id in zip(specs, phy_ids, logic_ids, strict=True):
            f = spec.fields
            dcmi_chip = spec.chip * spec.model.dies_per_chip + spec.die_index
            vdie_id = str(f.get("vdieId") or _default_vdie_id(seed, spec, dcmi_chip))
            bus_id = str(f.get("busId") or _default_bus_id(spec.card, dcmi_chip))
            for key, value in (
                ("phyId", phy_id),
                ("logicId", logic_id),
                ("vdieId", vdie_id),
                ("busId", bus_id),
            ):
                norm = value.upper() if isinstance(value, str) else value
                if norm in seen[key]:
                    raise self.fail(
                        f"{spec.path}.{key}",
                        f"duplicate die: {key} {value} is also used by {seen[key][norm]}",
                    )
                seen[key][norm] = spec.path
            die = Die(
                vdie_id=vdie_id,
                model=spec.model.name,
                card_id=spec.card,
                chip_id=dcmi_chip,
                phy_id=phy_id,
                logic_id=logic_id,
                pci_bus_id=bus_id,
                numa_node=_int(f.get("numaNode"), 0),
                memory_mib=_int(f.get("memoryMiB"), spec.model.memory_mib),
                aicore=_int(f.get("aicore"), spec.model.aicore),
                aicpu=_int(f.get("aicpu"), spec.model.aicpu),
                health=Health(str(f.get("health", Health.HEALTHY.value))),
                die_index=spec.die_index,
                npu_name=spec.npu_name,
            )
            dies.append(die)
            if "mode" in f:
                modes[phy_id] = DieMode(str(f["mode"]))
        return dies, modes


def _fill_sequential(explicit: Sequence[object]) -> list[int]:
    """Keep explicit IDs; give the others the smallest integers not taken, in order."""
    taken = {v for v in explicit if isinstance(v, int)}
    out: list[int] = []
    candidate = 0
    for value in explicit:
        if isinstance(value, int):
            out.append(value)
            continue
        while candidate in taken:
            candidate += 1
        out.append(candidate)
        taken.add(candidate)
    return out


def _default_vdie_id(seed: str, spec: _DieSpec, dcmi_chip: int) -> str:
    """A stable VDie ID from node-independent facts (seed, model, card, chip index)."""
    digest = hashlib.sha256(f"flexnpu-emulated/{seed}/{spec.model.name}/{spec.card}/{dcmi_chip}".encode())
    hexed = digest.hexdigest().upper()[:40]
    return "-".join(hexed[i : i + 8] for i in range(0, 40, 8))


def _default_bus_id(card: int, dcmi_chip: int) -> str:
    """A stable, unique PCI bus ID per (card, chip): 8 bus numbers per card."""
    n = card * 8 + dcmi_chip
    return f"{n // 240:04X}:{0x10 + n % 240:02X}:00.0"


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) else default


def _join(path: str | None, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"
