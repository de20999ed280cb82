"""Test doubles stay out of the production import graph.

Each console-script entry point (and the modules the node process builds itself from) is imported
in a fresh interpreter; none may pull in ``dra_driver.testing`` (the fake API server, the kubelet
and scheduler simulators, harnesses, the demo) or anything under ``tests``. The rule this guards
is written in ``dra_driver/testing/__init__.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

ENTRY_POINTS = [
    pytest.param("kubeletplugin.cli", id="flexnpu-dra"),
    pytest.param("kubeletplugin.node", id="node-process"),
    pytest.param("kubeletplugin.smi", id="flexnpu-smi"),
    pytest.param("dra_driver.daemon.main", id="flexnpu-daemon"),
    pytest.param("dra_driver.aclserver.main", id="flexnpu-aclserver"),
    pytest.param("dra_driver.client.acl", id="client-library"),
]

PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("dra_driver.testing", "tests")))))
"""


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_entry_point_imports_no_test_double(module: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, module],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_demo_lives_with_the_doubles_and_still_runs_from_the_cli() -> None:
    """``flexnpu-dra demo`` imports the demo only when asked: its --help works without running it."""
    out = subprocess.run(
        [sys.executable, "-m", "kubeletplugin.cli", "demo", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0 and "--keep" in out.stdout
    assert (REPO / "dra_driver" / "testing" / "demo.py").exists()
    assert not (REPO / "kubeletplugin" / "demo.py").exists()
