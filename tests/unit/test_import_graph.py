"""The import graph's rules, checked on the source (every import, also those inside functions).

* Test doubles stay out of the product: no module of a shipped package imports ``flexnpu_testing``
  or ``tests``, and each console-script entry point, imported in a fresh interpreter, pulls in
  neither (the rule is written in ``flexnpu_testing/__init__.py``).
* The production code has no import cycle, type-only imports included; neither has
  ``flexnpu_testing`` (the fake API server once imported the scheduler's helpers, which imported the
  fake API server).
* ``flexnpu-dra demo`` only says how to run the demo from a clone.
* The type graph is straight: the domain core, the kubelet plugin and the controllers import no
  module of the host runtime (``flexnpu_runtime/``); the values both sides need live in
  ``flexnpu_wire`` and ``dra_driver/daemon_api/``. Two modules are the documented exceptions:
  ``dra_driver/probes.py`` (the daemon's own readiness probe reads the daemon's flag table) and
  ``kubeletplugin/metrics.py`` (wires the aclservers' ledger reader into the usage metrics).
* There are no alias modules: every module is imported by its one path.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCT = (
    "dra_driver",
    "flexnpu_runtime",
    "kubeletplugin",
    "controller",
    "api_protos",
    "client/flexnpu_client",
    "client/flexnpu_wire",
)

ENTRY_POINTS = [
    pytest.param("kubeletplugin.cli", id="flexnpu-dra"),
    pytest.param("kubeletplugin.node", id="node-process"),
    pytest.param("kubeletplugin.smi", id="flexnpu-smi"),
    pytest.param("flexnpu_runtime.daemon.main", id="flexnpu-daemon"),
    pytest.param("flexnpu_runtime.aclserver.main", id="flexnpu-aclserver"),
    pytest.param("flexnpu_client.acl", id="client-library"),
]

PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("flexnpu_testing", "tests")))))
"""


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO)
    parts = list(rel.with_suffix("").parts)
    if parts[0] == "client":
        parts = parts[1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, *, typing: bool = False) -> Iterator[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved); ``typing``: also those
    under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path).rpartition(".")[0] if path.name != "__init__.py" else module_name(path)
    for node in ast.walk(tree) if typing else _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                yield f"{base}.{alias.name}"  # a submodule, or a name in ``base`` (see _owner)


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:`` (imports for the type checker only)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in ast.walk(child))
            continue
        yield node
        yield from _runtime_nodes(node)


def sources(*roots: str) -> list[Path]:
    return sorted(p for root in roots for p in (REPO / root).rglob("*.py") if "gen" not in p.parts)


def offenders(roots: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    out = []
    for path in sources(*roots):
        for name in imports_of(path):
            if name.split(".")[0] in forbidden or name in forbidden:
                out.append(f"{path.relative_to(REPO)} imports {name}")
    return sorted(set(out))


def test_no_product_module_imports_a_test_double() -> None:
    assert offenders(PRODUCT, ("flexnpu_testing", "tests")) == []


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


def _graph(*roots: str, typing: bool = False) -> dict[str, set[str]]:
    """module -> the modules under ``roots`` it imports."""
    modules = {module_name(p): p for p in sources(*roots)}
    return {
        name: {
            m
            for m in (_owner(i, modules) for i in imports_of(path, typing=typing))
            if m and not _within(name, m)
        }
        for name, path in modules.items()
    }


def test_the_doubles_have_no_import_cycle() -> None:
    assert _cycles(_graph("flexnpu_testing")) == []


def test_the_aclserver_core_has_no_import_cycle_type_imports_included() -> None:
    """Issue 28 item 3: two cycles lived only in ``if TYPE_CHECKING:`` blocks (claim -> dispatch ->
    memory/models -> claim; backend <-> quota)."""
    graph = _graph("flexnpu_runtime/aclserver", typing=True)
    core = {
        f"flexnpu_runtime.aclserver.{m}"
        for m in ("claim", "dispatch", "memory", "models", "backend", "quota")
    }
    assert core <= set(graph)
    assert _cycles(graph) == []


def test_the_production_code_has_no_import_cycle_type_imports_included() -> None:
    """Issue 28: no import cycle anywhere in the shipped code (the driver, the helper, the runtime, the
    client distribution), counting every import: inside functions and under ``if TYPE_CHECKING:``."""
    graph = _graph(*PRODUCT, "dra_kubeletplugin", typing=True)
    assert {"kubeletplugin.node", "flexnpu_runtime.aclserver.ledger", "flexnpu_client.session"} <= set(graph)
    assert "dra_driver.config" in graph["kubeletplugin.node"]  # edges across the packages are seen
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _owner(imported: str, modules: dict[str, Path]) -> str | None:
    """The module of ``modules`` that ``imported`` names (a module, or a name inside one)."""
    while imported:
        if imported in modules:
            return imported
        imported = imported.rpartition(".")[0]
    return None


def _within(module: str, other: str) -> bool:
    """``other`` is ``module`` or a package around it (Python initialises those first)."""
    return module == other or module.startswith(other + ".")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cli_demo_says_how_to_run_the_demo_from_a_clone() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kubeletplugin.cli", "demo"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert "scripts/demo.sh" in out.stderr and "python -m flexnpu_testing.demo" in out.stderr
    assert (REPO / "flexnpu_testing" / "demo.py").exists()
    assert not (REPO / "kubeletplugin" / "demo.py").exists()


def test_no_wheel_ships_the_doubles() -> None:
    """The driver's wheel is made of ``packages.find``'s packages: the doubles are not among them."""
    import tomllib

    import setuptools

    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    shipped = set(setuptools.find_packages(where=str(REPO), include=include["include"]))
    assert {
        "dra_driver",
        "dra_kubeletplugin",
        "dra_kubeletplugin.resourceslice",
        "kubeletplugin",
        "controller",
    } <= shipped
    assert not {p for p in shipped if p.split(".")[0] in ("flexnpu_testing", "tests", "bench")}


RUNTIME = ("flexnpu_runtime",)
RUNTIME_EXCEPTIONS = ("dra_driver/probes.py", "kubeletplugin/metrics.py")


def _within_files(path: Path, prefixes: tuple[str, ...]) -> bool:
    rel = str(path.relative_to(REPO))
    return any(rel == p or rel.startswith(p + "/") for p in prefixes)


def test_the_core_imports_no_runtime_module() -> None:
    roots = ("dra_driver", "kubeletplugin", "controller")
    bad = []
    for path in sources(*roots):
        if _within_files(path, RUNTIME_EXCEPTIONS):
            continue
        bad += [
            f"{path.relative_to(REPO)} imports {n}"
            for n in imports_of(path)
            if any(n == r or n.startswith(r + ".") for r in RUNTIME)
        ]
    assert sorted(set(bad)) == []


def test_no_module_is_only_an_alias_of_another() -> None:
    """A module whose every statement is an import (a re-export under an old path) is gone, not kept."""
    aliases = []
    for path in sources(*PRODUCT):
        body = ast.parse(path.read_text()).body
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(getattr(body[0], "value", None), ast.Constant)
        ):
            body = body[1:]
        rest = [
            n
            for n in body
            if not (
                isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
            )
        ]
        if (
            path.name != "__init__.py"
            and rest
            and all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in rest)
        ):
            aliases.append(str(path.relative_to(REPO)))
    assert aliases == []


HELPER_FORBIDDEN = ("dra_driver", "kubeletplugin", "controller", "api_protos", "flexnpu_wire", "flexnpu_client",
                    "flexnpu_testing", "tests")  # fmt: skip


def test_the_kubelet_plugin_helper_imports_nothing_of_the_npu_driver() -> None:
    assert offenders(("dra_kubeletplugin",), HELPER_FORBIDDEN) == []


def test_the_helper_loads_alone_and_cheaply() -> None:
    """Importing the helper (its public names, and ``start``) pulls in no NPU module; the package itself no grpc."""
    probe = (
        "import json, sys\n"
        "import dra_kubeletplugin\n"
        "light = 'grpc' not in sys.modules\n"
        "from dra_kubeletplugin import start, Helper, KubeClient\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {HELPER_FORBIDDEN!r})\n"
        "print(json.dumps([light, bad]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd="/", capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == [True, []]
