"""docs/flags.md states the plugin's flags as ``flexnpu-dra plugin`` has them: one table row per flag
of ``dra_driver.config.PLUGIN_FLAGS``, with its environment twin, its old spellings and its default,
and no row for a flag the plugin does not take."""

from __future__ import annotations

import re
from pathlib import Path

from dra_driver.config import PLUGIN_FLAGS

DOC = Path(__file__).resolve().parents[2] / "docs" / "flags.md"


def _rows() -> dict[str, tuple[list[str], list[str], str]]:
    """``--flag`` → (every flag spelling, every environment twin, default) of the plugin's table."""
    section = DOC.read_text().split("## `flexnpu-dra plugin`", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if not line.startswith("| `--") or len(cells) != 4:
            continue
        flags, envs = re.findall(r"`(--[\w-]+)`", cells[0]), re.findall(r"`(\w+)`", cells[1])
        default = m.group(1) if (m := re.fullmatch(r"`([^`]*)`", cells[2])) else cells[2]
        rows[flags[0]] = (flags, envs, default)
    return rows


def test_the_plugin_flag_table_is_the_plugins() -> None:
    rows = _rows()
    assert set(rows) == {f"--{f.name}" for f in PLUGIN_FLAGS}, "docs/flags.md and PLUGIN_FLAGS differ"
    for flag in PLUGIN_FLAGS:
        spellings, envs, default = rows[f"--{flag.name}"]
        assert spellings == [f"--{n}" for n in (flag.name, *flag.aliases)], flag.name
        assert envs == list(flag.envs), flag.name
        assert default == (flag.default if flag.default is not None else "—"), flag.name
