"""HDK hard-split templates: which ones a chip model offers and what each one takes from a die.

Pure data and parsing. One table (:data:`TABLE`) gives the templates per chip model with their
resources; on a real node ``npu-smi info -t template-info`` overrides it
(:func:`parse_template_info`, run by ``dra_driver/discovery/npu_smi.py``). The slice builder
(``dra_driver/slices.py``) turns templates into devices; the vNPU manager
(``dra_driver/vnpu/``) creates and destroys their instances. Nothing here touches the world.

Template names follow ``virNN[_Mc][_Gg][_m|_nm|_dvpp|_ndvpp]``: NN AI Cores, M AI CPUs, G GB of
memory; ``_dvpp``/``_m`` take all media engines of the die, ``_ndvpp``/``_nm`` none. Where a
template names no AI CPU or memory (310P, A1) the figures come from the product documentation.

Media engines (310P VPC/VDEC/JPEGD/VENC/JPEGE) are modelled as one ``media`` amount per die
equal to its AI Core count: a plain template takes as much as it has AI Cores, ``_dvpp`` takes
all of it, ``_ndvpp`` none. So ``vir04_4c_dvpp`` leaves the die's other templates only the
``_ndvpp`` ones, and the recommended combinations (``vir04`` + ``vir04_3c``,
``vir04`` + ``vir02`` + ``vir02_1c``) fit exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dra_driver.errors import ErrorCode, InvalidInput

__all__ = [
    "TABLE",
    "VNPU_ID_BASE",
    "Template",
    "for_model",
    "instances",
    "media_default",
    "media_of",
    "parse_name",
    "parse_template_info",
    "template_memory_mib",
    "vnpu_id_range",
]

GIB_IN_MIB = 1024
VNPU_ID_BASE = 100
"""vNPU IDs of the die with physical ID p are ``p*16+100`` … (mind-cluster's devmanager: MinVDevID 100)."""
VNPU_IDS_PER_DIE_STRIDE = 16

_NAME = re.compile(r"^vir(\d{2})(?:_(\d+)c)?(?:_(\d+)g)?(?:_(m|nm|dvpp|ndvpp))?$")


@dataclass(frozen=True, slots=True)
class Template:
    """One HDK template and what an instance of it takes from its die.

    ``media`` is None on chips whose media engines are not modelled (A2, A3); else the amount
    of the die's ``media`` (see the module docstring).
    """

    name: str
    aicore: int
    aicpu: int
    memory_mib: int
    media: int | None = None

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 1024 * 1024

    @property
    def dns_name(self) -> str:
        """The name as a DNS label fragment (``vir10_3c_32g`` -> ``vir10-3c-32g``)."""
        return self.name.replace("_", "-")


@dataclass(frozen=True, slots=True)
class _ChipTemplates:
    templates: tuple[Template, ...]
    memory_mib: int  # what the HDK divides among templates (nominal; may exceed the usable figure)
    vnpu_ids: int  # vNPU IDs per die: +0..+7 (inference) or +0..+15 (training)
    media: int | None  # the die's media amount, None when not modelled


def parse_name(name: str) -> tuple[int, int | None, int | None, str]:
    """(AI Cores, AI CPUs or None, memory GB or None, media suffix or '') from a template name.

    InvalidInput (field ``template``) for a name that is not ``virNN[_Mc][_Gg][_suffix]``.
    """
    m = _NAME.match(name)
    if m is None:
        raise InvalidInput(
            f"template {name[:64]!r} is not of the form virNN[_Mc][_Gg][_m|_nm|_dvpp|_ndvpp]",
            code=ErrorCode.INVALID_ARGUMENT,
            field="template",
        )
    return (
        int(m.group(1)),
        int(m.group(2)) if m.group(2) else None,
        int(m.group(3)) if m.group(3) else None,
        m.group(4) or "",
    )


def _named(names: Iterable[str]) -> tuple[Template, ...]:
    """Templates whose AI CPU and memory are in their names (A2, A3)."""
    out = []
    for name in names:
        cores, cpus, gb, _ = parse_name(name)
        assert cpus is not None and gb is not None
        out.append(Template(name, cores, cpus, gb * GIB_IN_MIB))
    return tuple(out)


def _p310(name: str, cores: int, gb: int, cpus: int) -> Template:
    _, _, _, suffix = parse_name(name)
    media = {"dvpp": 8, "m": 8, "ndvpp": 0, "nm": 0}.get(suffix, cores)
    return Template(name, cores, cpus, gb * GIB_IN_MIB, media)


_A2_TRAINING = _named(("vir03_1c_8g", "vir06_1c_16g", "vir12_3c_32g"))
_A3_TRAINING = _named(("vir06_1c_16g", "vir12_3c_32g"))

# Chip model -> templates (mind-cluster's vNPU template docs; 310P per-template resources from Huawei CCE's docs).
TABLE: dict[str, _ChipTemplates] = {
    "910B1": _ChipTemplates(_A2_TRAINING, 65536, 16, None),
    "910B2": _ChipTemplates(_A2_TRAINING, 65536, 16, None),
    "910B2C": _ChipTemplates(_A2_TRAINING, 65536, 16, None),
    "910B3": _ChipTemplates(
        _named(("vir05_1c_16g", "vir10_3c_32g")),
        65536,
        8,
        None,
    ),
    "910B4": _ChipTemplates(
        _named(
            (
                "vir05_1c_8g",
                "vir05_1c_16g",
                "vir10_3c_16g",
                "vir10_3c_16g_nm",
                "vir10_4c_16g_m",
                "vir10_3c_32g",
            )
        ),
        32768,
        8,
        None,
    ),
    "Ascend910": _ChipTemplates(_A3_TRAINING, 65536, 16, None),
    "310P3": _ChipTemplates(
        (
            _p310("vir01", 1, 3, 1),
            _p310("vir02", 2, 6, 2),
            _p310("vir02_1c", 2, 6, 1),
            _p310("vir04", 4, 12, 4),
            _p310("vir04_3c", 4, 12, 3),
            _p310("vir04_3c_ndvpp", 4, 12, 3),
            _p310("vir04_4c_dvpp", 4, 12, 4),
        ),
        24576,
        8,
        8,
    ),
}


def for_model(
    model: str, overrides: Mapping[str, tuple[Template, ...]] | None = None
) -> tuple[Template, ...]:
    """The templates of a chip model: ``overrides`` (from template-info) first, else the table."""
    if overrides and model in overrides:
        return overrides[model]
    entry = TABLE.get(model)
    return entry.templates if entry else ()


def template_memory_mib(model: str, die_memory_mib: int) -> int:
    """Memory the HDK divides among templates: the nominal figure, at least the die's own."""
    entry = TABLE.get(model)
    return max(die_memory_mib, entry.memory_mib if entry else 0)


def media_of(model: str) -> int | None:
    """The die's media amount (310P), or None when media engines are not modelled."""
    entry = TABLE.get(model)
    return entry.media if entry else None


def vnpu_id_range(model: str, phy_id: int) -> range:
    """The vNPU IDs the driver may use on this die (``phy*16+100`` … ``+7`` or ``+15``)."""
    entry = TABLE.get(model)
    count = entry.vnpu_ids if entry else 8
    base = VNPU_ID_BASE + phy_id * VNPU_IDS_PER_DIE_STRIDE
    return range(base, base + count)


def instances(template: Template, *, aicore: int, aicpu: int, memory_mib: int, media: int | None) -> int:
    """How many instances of ``template`` alone fit a die with these resources."""
    fits = [aicore // template.aicore if template.aicore else 0, memory_mib // template.memory_mib]
    if template.aicpu:
        fits.append(aicpu // template.aicpu)
    if media is not None and template.media:
        fits.append(media // template.media)
    return max(0, min(fits))


_HEADER_WORDS = ("name", "aicore", "memory")
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)\s*(GB|G|MB|M)?$", re.IGNORECASE)


def parse_template_info(text: str, *, model: str) -> tuple[Template, ...]:
    """Templates from ``npu-smi info -t template-info`` (pure).

    Expects a header line naming at least ``Name``, ``AICORE`` and ``Memory`` columns (an
    ``AICPU`` column is used when present) and one row per template starting with ``vir``;
    memory in GB (``16GB``, ``16``) or MB (``16384MB``). Columns are matched by position after
    splitting on ``|`` and whitespace. InvalidInput (code ``INVALID_NPU_SMI``, field
    ``template-info``) when there is no such header, a row does not parse, or no row is found.
    """
    header: list[str] | None = None
    out: list[Template] = []
    for raw in text.splitlines():
        cells = raw.replace("|", " ").split()
        if not cells:
            continue
        lowered = [c.lower() for c in cells]
        if header is None and all(w in lowered for w in _HEADER_WORDS):
            header = lowered
            continue
        if header is None or not cells[0].startswith("vir"):
            continue
        if len(cells) < len(header):
            raise _bad(f"template row {raw.strip()[:120]!r} has {len(cells)} of {len(header)} columns")
        row = dict(zip(header, cells, strict=False))
        name = row["name"]
        if not _NAME.match(name):
            raise _bad(f"template name {name[:64]!r} is not of the form virNN[_Mc][_Gg][_suffix]")
        cores, cpus_in_name, _, _ = parse_name(name)
        try:
            aicore = int(row["aicore"])
            aicpu = int(row["aicpu"]) if "aicpu" in row else (cpus_in_name or 0)
        except ValueError:
            raise _bad(
                f"template {name!r}: AICORE/AICPU {row.get('aicore')!r}/{row.get('aicpu')!r} are not integers"
            ) from None
        mem = _MEMORY.match(row["memory"])
        if mem is None:
            raise _bad(f"template {name!r}: memory {row['memory'][:32]!r} is not like 16GB")
        amount = float(mem.group(1))
        unit = (mem.group(2) or "GB").upper()
        memory_mib = int(amount * GIB_IN_MIB) if unit in ("GB", "G") else int(amount)
        if aicore <= 0 or memory_mib <= 0 or aicore != cores:
            raise _bad(
                f"template {name!r}: AICORE {aicore} and memory {row['memory']!r} do not match its name"
            )
        base = next((t for t in for_model(model) if t.name == name), None)
        out.append(
            Template(
                name, aicore, aicpu, memory_mib, base.media if base else media_default(model, name, aicore)
            )
        )
    if header is None:
        raise _bad("no header line with Name, AICORE and Memory columns")
    if not out:
        raise _bad("no template rows (lines starting with 'vir')")
    return tuple(out)


def media_default(model: str, name: str, aicore: int) -> int | None:
    """Media amount of a template not in the table, from its name (310P only)."""
    total = media_of(model)
    if total is None:
        return None
    suffix = parse_name(name)[3]
    return {"dvpp": total, "m": total, "ndvpp": 0, "nm": 0}.get(suffix, aicore)


def _bad(message: str) -> InvalidInput:
    return InvalidInput(
        f"npu-smi info -t template-info: {message}", code=ErrorCode.INVALID_NPU_SMI, field="template-info"
    )
