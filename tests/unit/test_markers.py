"""The ``root``/``podman`` marker rules (``tests/markers.py``) stop a collection that breaks them.

Each row is a small test module collected by a real pytest subprocess with this repository's hook.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flexnpu_testing import pythonpath_env

CONFTEST = """
import pytest
from tests import markers

@pytest.fixture
def podman():
    yield None

@pytest.fixture
def tmpfs(tmp_path):
    subprocess_run(["mount", "-t", "tmpfs", "x", str(tmp_path)])
    yield tmp_path

def subprocess_run(argv):
    return argv

def pytest_collection_modifyitems(items):
    markers.check(items)
"""

CASES = [
    pytest.param("def test_a():\n    assert True\n", "", id="plain-test"),
    pytest.param(
        "def test_a():\n    run(['mount', '--bind', 'a', 'b'])\n",
        "needs root (mount, network namespace or podman) but is not marked root",
        id="mount-without-root",
    ),
    pytest.param(
        "@pytest.mark.root\ndef test_a():\n    _helper()\n\ndef _helper():\n    run(['umount', 'x'])\n",
        "",
        id="root-through-a-helper",
    ),
    pytest.param(
        "def test_a(tmpfs):\n    assert tmpfs\n",
        "needs root (mount, network namespace or podman) but is not marked root",
        id="root-through-a-fixture",
    ),
    pytest.param(
        "@pytest.mark.root\ndef test_a():\n    assert True\n",
        "marked root but does nothing",
        id="root-unneeded",
    ),
    pytest.param(
        "@pytest.mark.root\ndef test_a(podman):\n    assert podman is None\n",
        "runs podman but is not marked podman",
        id="podman-fixture-without-marker",
    ),
    pytest.param(
        "@pytest.mark.podman\ndef test_a(podman):\n    assert podman is None\n",
        "marked podman but not root",
        id="podman-without-root",
    ),
    pytest.param(
        "@pytest.mark.podman\n@pytest.mark.root\ndef test_a():\n    assert True\n",
        "marked podman but never runs podman",
        id="podman-unneeded",
    ),
    pytest.param(
        "@pytest.mark.root\ndef test_a():\n    netns.create('x')\n",
        "",
        id="netns-marked",
    ),
]


@pytest.mark.parametrize(("body", "problem"), CASES)
def test_marker_rules(tmp_path: Path, body: str, problem: str) -> None:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    header = "import pytest\nrun = netns = None\n\n"
    (tmp_path / "test_case.py").write_text(header + body)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n  root: r\n  podman: p\n")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", str(tmp_path)],
        cwd=tmp_path,
        env=pythonpath_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    text = out.stdout + out.stderr
    if problem:
        assert out.returncode != 0 and problem in text and "test_case.py::test_a" in text, text
    else:
        assert out.returncode == 0, text
