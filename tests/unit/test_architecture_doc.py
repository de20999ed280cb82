"""docs/architecture.md stays true: every repository path it names exists, every module it names imports.

A path is a backticked token whose first part is a top-level entry of the repository
(``dra_driver/cdi.py``, ``tests/data/checkpoint/``; ``{a,b}`` and ``*`` expand). A bare file name
(``pools.py``) must exist beside a path named earlier in the same paragraph or table row, or, when
none is, somewhere in the repository. Every Python file named that way, and every dotted name of
one of the packages (``dra_driver.telemetry``), must import.
"""

from __future__ import annotations

import importlib
import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}
BARE_FILE = re.compile(r"^[\w*.-]+\.(py|proto|c|h|md|toml|yaml|json)$")
DOTTED = re.compile(
    r"^(dra_driver|flexnpu_runtime|dra_kubeletplugin|kubeletplugin|controller|flexnpu_wire|flexnpu_client|flexnpu_testing)(\.\w+)+$"
)
# Where a Python package's import root is, for a path under it.
IMPORT_ROOTS = {
    "dra_driver": "",
    "flexnpu_runtime": "",
    "dra_kubeletplugin": "",
    "kubeletplugin": "",
    "controller": "",
    "flexnpu_testing": "",
    "api_protos": "",
    "client": "client/",
}


def _blocks(text: str) -> list[str]:
    """Paragraphs, with each table row a block of its own."""
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        rows = [line for line in para.splitlines() if line.startswith("|")]
        rest = [line for line in para.splitlines() if not line.startswith("|")]
        out += rows
        if rest:
            out.append("\n".join(rest))
    return out


def _expand(token: str) -> list[str]:
    m = re.search(r"\{([^}]*)\}", token)
    if not m:
        return [token]
    return list(
        itertools.chain.from_iterable(
            _expand(token[: m.start()] + part + token[m.end() :]) for part in m.group(1).split(",")
        )
    )


def _exists(rel: str) -> bool:
    return any(ROOT.glob(rel.rstrip("/"))) if "*" in rel else (ROOT / rel.rstrip("/")).exists()


def _module_of(rel: str) -> str | None:
    top = rel.split("/", 1)[0]
    if top not in IMPORT_ROOTS or not rel.endswith(".py") or "*" in rel:
        return None
    inner = rel.removeprefix(IMPORT_ROOTS[top]).removesuffix(".py").removesuffix("/__init__")
    return inner.replace("/", ".")


def _named(doc: Path = DOC) -> tuple[list[tuple[str, str]], set[str]]:
    """(token, why it is wrong) for each bad path, and the modules named."""
    bad: list[tuple[str, str]] = []
    modules: set[str] = set()
    tracked = {p.name for p in ROOT.rglob("*") if ".venv" not in p.parts and ".git" not in p.parts}
    for block in _blocks(doc.read_text()):
        dirs: list[str] = []
        for raw in re.findall(r"`([^`]+)`", block):
            token = raw.strip()
            if DOTTED.match(token) and not BARE_FILE.match(token):
                modules.add(token)
                continue
            if " " in token or "<" in token:
                continue
            for rel in _expand(token):
                if "/" in rel and rel.split("/", 1)[0] in TOP:
                    if not _exists(rel):
                        bad.append((rel, "no such path"))
                        continue
                    dirs.append(rel if rel.endswith("/") else rel.rsplit("/", 1)[0] + "/")
                    if module := _module_of(rel):
                        modules.add(module)
                elif BARE_FILE.match(rel):
                    if dirs:
                        found = [d + rel for d in dirs if _exists(d + rel)]
                        if not found:
                            bad.append((rel, f"not beside any of {sorted(set(dirs))}"))
                        for f in found:
                            if module := _module_of(f):
                                modules.add(module)
                    elif not any(Path(rel).match(pattern) for pattern in tracked) and rel not in tracked:
                        bad.append((rel, "no file of that name"))
    return bad, modules


def test_every_path_the_architecture_names_exists() -> None:
    bad, _ = _named()
    assert not bad, "docs/architecture.md names paths that do not exist:\n" + "\n".join(
        f"  {token}: {why}" for token, why in bad
    )


def test_the_check_sees_a_missing_path(tmp_path: Path) -> None:
    doc = tmp_path / "architecture.md"
    doc.write_text(
        "| a | `dra_driver/cdi.py`, `nothere.py` |\n\n`dra_driver/gone.py` and `dra_driver/{cdi,paths}.py`,"
        " `dra_driver.telemetry`, `dra_driver.nowhere`\n"
    )
    bad, modules = _named(doc)
    assert sorted(t for t, _ in bad) == ["dra_driver/gone.py", "nothere.py"]
    assert modules == {"dra_driver.cdi", "dra_driver.paths", "dra_driver.telemetry", "dra_driver.nowhere"}
    with pytest.raises(ModuleNotFoundError):
        _imports("dra_driver.nowhere")


@pytest.mark.parametrize("module", sorted(_named()[1]))
def test_every_module_the_architecture_names_imports(module: str) -> None:
    _imports(module)


def _imports(module: str) -> None:
    """Import ``module``, or its parent when the last part is an attribute (``a.b.Name``)."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        parent, _, attr = module.rpartition(".")
        if exc.name != module or not hasattr(importlib.import_module(parent), attr):
            raise
