"""A clone installs the Python way: ``pip install -e .`` and ``pip install .`` in fresh virtualenvs
bring the driver and the container client (``client/``, not on any index) with nothing else but
the declared dependencies.

The dependencies come from the package index once, into a wheelhouse (``pip wheel``, which also
resolves the client from the clone); each install then runs offline (``--no-index``) from that
wheelhouse with build isolation, as a user's would, so it can use nothing the project does not
declare. The driver's and the client's own wheels are taken out of the wheelhouse: each install
builds them from the clone.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.o")
PIP_TIMEOUT = 600


def _run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=PIP_TIMEOUT, check=False
    )
    assert proc.returncode == 0, (
        f"{' '.join(map(str, args))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("clone") / "flexnpu-dra-driver"
    shutil.copytree(ROOT, src, ignore=IGNORE)
    return src


@pytest.fixture(scope="module")
def wheelhouse(clone: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheels = tmp_path_factory.mktemp("wheelhouse")
    _run(sys.executable, "-m", "pip", "wheel", "-q", "-w", wheels, clone)  # every dependency, as wheels
    _run(
        sys.executable, "-m", "pip", "download", "-q", "-d", wheels, "setuptools>=77", "wheel"
    )  # build backend
    built = sorted(p.name for p in wheels.glob("flexnpu_*.whl"))
    assert [n.split("-")[0] for n in built] == ["flexnpu_client", "flexnpu_dra_driver"], built
    for name in built:
        (wheels / name).unlink()
    return wheels


def _fresh_venv(where: Path) -> Path:
    venv.EnvBuilder(with_pip=True, clear=True).create(where)
    return where / "bin" / "python"


def _offline_install(py: Path, wheels: Path, *target: str | Path) -> None:
    _run(py, "-m", "pip", "install", "-q", "--no-index", "--find-links", wheels, *target)


def _where(py: Path, module: str) -> Path:
    # -I: not the working directory's (this repository's) packages, nor PYTHONPATH
    return Path(_run(py, "-I", "-c", f"import {module}; print({module}.__file__)").stdout.strip())


@pytest.mark.parametrize(
    "editable", [pytest.param(True, id="pip-install-e-dot"), pytest.param(False, id="pip-install-dot")]
)
def test_a_clone_installs(editable: bool, clone: Path, wheelhouse: Path, tmp_path: Path) -> None:
    py = _fresh_venv(tmp_path / "venv")
    if editable:
        _offline_install(py, wheelhouse, "-e", clone)
    else:
        _offline_install(py, wheelhouse, clone)
    driver = _where(py, "dra_driver")
    assert driver.is_relative_to(clone if editable else tmp_path / "venv"), (
        driver
    )  # editable: the clone's files
    for module in ("flexnpu_client", "flexnpu_wire"):  # the client distribution came along
        assert _where(py, module).is_relative_to(tmp_path / "venv"), module
    names = {
        line.split("==")[0].split(" @ ")[0].lower()
        for line in _run(py, "-m", "pip", "list", "--format=freeze").stdout.split()
    }
    assert {"flexnpu-dra-driver", "flexnpu-client", "grpcio", "kubernetes"} <= names
    _run(py, "-m", "pip", "check")
    bindir = py.parent
    for script in ("flexnpu-dra", "flexnpu-smi", "flexnpu-daemon", "flexnpu-aclserver", "flexnpu-probe"):
        assert "usage" in _run(bindir / script, "--help").stdout.lower(), script
    # the driver's metadata names the client it needs
    requires = _run(
        py, "-c", "import importlib.metadata as m; print(m.requires('flexnpu-dra-driver'))"
    ).stdout
    assert "flexnpu-client" in requires
