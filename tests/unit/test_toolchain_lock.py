"""The toolchain is locked: what the test command installs is what ``constraints.txt`` holds, and every
pip that installs for the project (the test command, the demo, the PyTorch venv, the image build) reads it.

A fresh clone then installs what main was tested with, whatever upstream released since (issue 28: a new
grpcio-tools turned ``.ci/run`` red on a fresh machine). Upgrading a version is a deliberate edit of
``constraints.txt``.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "flexnpu-dra-driver"


def locked(text: str | None = None) -> dict[str, str]:
    """name -> version of every ``name==version`` line of constraints.txt."""
    out = {}
    for line in (text if text is not None else (ROOT / "constraints.txt").read_text()).splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep:
            out[canonicalize_name(name.strip())] = version.strip()
    return out


def closure(project: str, extras: tuple[str, ...]) -> set[str]:
    """The installed distributions ``project[extras]`` needs, transitively (markers evaluated here)."""
    seen: set[str] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [(project, extras)]
    while todo:
        name, wanted = todo.pop()
        requires = metadata.distribution(name).requires or []
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (*wanted, "")):
                continue
            key = canonicalize_name(req.name)
            if key not in seen:
                seen.add(key)
                todo.append((req.name, tuple(req.extras)))
    return seen


def test_every_package_the_test_command_installs_is_locked_at_its_installed_version() -> None:
    lock = locked()
    needed = closure(PROJECT, ("dev",))
    assert {"grpcio", "grpcio-tools", "kubernetes", "pytest", "ruff", "mypy", "protobuf"} <= needed
    missing = sorted(n for n in needed if n not in lock and not n.startswith("flexnpu"))
    assert missing == [], f"installed but not locked in constraints.txt: {missing}"
    differ = sorted(
        (n, metadata.version(n), lock[n]) for n in needed if n in lock and metadata.version(n) != lock[n]
    )
    assert differ == [], (
        f"installed at another version than constraints.txt locks (run scripts/bootstrap.sh): {differ}"
    )


def test_the_build_backend_is_locked() -> None:
    import tomllib

    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    names = {canonicalize_name(Requirement(r).name) for r in requires}
    assert names and names <= set(locked())
    assert "pip" in locked()


PIP_CALL = re.compile(r"\bpip3?\b[^\n]*\b(?:install|wheel|download)\b")
LOCK = 'PIP_CONSTRAINT="$ROOT/constraints.txt"'


def reads_lock_first(script: str) -> bool:
    """Whether ``script`` (shell) sets PIP_CONSTRAINT to constraints.txt before its first pip call."""
    first = PIP_CALL.search(script)
    assert first is not None, "the script runs no pip: this check would see nothing"
    return 0 <= script.find(LOCK) < first.start()


@pytest.mark.parametrize(
    "script",
    [
        pytest.param("scripts/bootstrap.sh", id="test-command-and-demo"),
        pytest.param("scripts/torch-venv.sh", id="pytorch-venv"),
        pytest.param("scripts/build-image.sh", id="image-build"),
    ],
)
def test_each_script_that_runs_pip_reads_the_lock_first(script: str) -> None:
    assert reads_lock_first((ROOT / script).read_text()), f"{script} runs pip before it reads constraints.txt"


def test_the_image_installs_only_the_wheels_the_locked_build_made() -> None:
    """The Containerfile's pip never reaches an index: it installs build/wheels and build/dist, which
    scripts/build-image.sh made under the lock."""
    text = (ROOT / "Containerfile").read_text()
    installs = re.findall(r"pip[^\n]*\binstall\b[^\n]*(?:\\\n[^\n]*)*", text)
    assert installs
    assert all("--no-index" in i for i in installs), installs


def test_the_checks_see_what_they_check() -> None:
    assert locked("a==1\n# b==2\nC_d == 3  # why\ne>=4\n") == {"a": "1", "c-d": "3"}
    assert not reads_lock_first(f"python -m pip install -q x\nexport {LOCK}\npip wheel y\n")
    assert reads_lock_first(f"export {LOCK}\n# pip installs nothing here\n$PY -m pip install -q x\n")
