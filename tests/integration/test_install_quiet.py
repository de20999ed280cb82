"""A quiet install: building the driver's and the client's distributions, as wheels and as editable
installs, makes the build backend warn about nothing (pip shows every warning a backend emits:
deprecated metadata, data directories missing from the packages, the editable-mode notes).

The backend's hooks run in a fresh interpreter with every warning an error, on a copy of the
clone, with the setuptools the lock (constraints.txt) puts in the virtualenv, which is the one
pip's build environments get too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.o")

_HOOK = """
import sys, setuptools.build_meta as backend
out = sys.argv[2]
name = backend.build_editable(out) if sys.argv[1] == "editable" else backend.build_wheel(out)
print(name)
"""


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("quiet") / "flexnpu-dra-driver"
    shutil.copytree(ROOT, src, ignore=IGNORE)
    return src


@pytest.mark.parametrize("kind", ["wheel", "editable"])
@pytest.mark.parametrize("where", [pytest.param(".", id="driver"), pytest.param("client", id="client")])
def test_the_build_backend_warns_about_nothing(clone: Path, tmp_path: Path, where: str, kind: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", _HOOK, kind, str(tmp_path)],
        cwd=clone / where,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"the {kind} build of {where} warned or failed:\n{proc.stderr[-4000:]}"
    (built,) = tmp_path.glob("*.whl")
    assert built.name == proc.stdout.strip().splitlines()[-1]
