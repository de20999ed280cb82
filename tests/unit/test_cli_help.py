"""``--help`` of every console script and every subcommand runs as a real process and exits 0.

The scripts are the ones ``pyproject.toml`` declares (read back from the installed distribution's entry points), and
the subcommands are read from each script's own top-level help, so a script or subcommand added later is covered
without editing this file. A ``%`` in a help string once crashed argparse here (issue 13).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

DIST = "flexnpu-dra-driver"
EXPECTED_SCRIPTS = {"flexnpu-dra", "flexnpu-daemon", "flexnpu-smi", "flexnpu-aclserver"}
EXPECTED_SUBCOMMANDS = {
    "flexnpu-dra": {"plugin", "probe", "webhook", "extender", "demo"},
    "flexnpu-smi": {"info", "cleanup", "unregister", "adopt", "discard", "uninstall"},
}


def _scripts() -> dict[str, Path]:
    eps = metadata.distribution(DIST).entry_points
    bindir = Path(sys.executable).parent
    return {ep.name: bindir / ep.name for ep in eps if ep.group == "console_scripts"}


def _help(argv: list[str]) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXNPU_")}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert proc.returncode == 0, f"{argv}: rc={proc.returncode}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.startswith("usage: "), proc.stdout[:200]
    return proc.stdout


def subcommands(help_text: str) -> set[str]:
    """Names listed under the positional argument of an argparse subparser action (4-space indent)."""
    section = help_text.split("positional arguments:", 1)
    if len(section) < 2:
        return set()
    body = section[1].split("\n\n", 1)[0]
    return {m.group(1) for m in re.finditer(r"^    ([a-z][a-z0-9-]*)(?:\s|$)", body, re.MULTILINE)}


def test_every_declared_script_is_installed() -> None:
    scripts = _scripts()
    assert set(scripts) == EXPECTED_SCRIPTS
    for name, path in scripts.items():
        assert path.is_file(), f"{name} not installed at {path}"


@pytest.mark.parametrize("script", sorted(EXPECTED_SCRIPTS))
def test_help_of_script_and_each_subcommand(script: str) -> None:
    path = str(_scripts()[script])
    top = _help([path, "--help"])
    subs = subcommands(top)
    assert subs == EXPECTED_SUBCOMMANDS.get(script, set()), top
    for sub in sorted(subs):
        text = _help([path, sub, "--help"])
        assert text.splitlines()[0].startswith(f"usage: {script} {sub}"), text[:200]


def test_percent_in_flag_help_is_shown_literally() -> None:
    text = _help([str(_scripts()["flexnpu-dra"]), "plugin", "--help"])
    assert "±20 %" in " ".join(text.split())
