"""The aclserver core has no import cycle, imports for the type checker included (issue 28 item 3).

``tests/unit/test_import_graph.py`` checks the layers of the whole product on runtime imports;
this checks the floors inside ``flexnpu_runtime/aclserver/``, where two cycles lived only in
``if TYPE_CHECKING:`` blocks (claim -> dispatch -> memory/models -> claim; backend <-> quota).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "flexnpu_runtime.aclserver"
ROOT = Path(__file__).resolve().parents[2] / "flexnpu_runtime" / "aclserver"


def _graph() -> dict[str, set[str]]:
    """module -> the modules of the package it imports (every import statement, anywhere)."""
    modules = {p.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".") for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        name = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
                base = node.module[len(PACKAGE) :].lstrip(".")
                for alias in node.names:
                    deps |= {m for m in (f"{base}.{alias.name}".lstrip("."), base) if m in modules}
            elif isinstance(node, ast.Import):
                deps |= {a.name[len(PACKAGE) + 1 :] for a in node.names if a.name.startswith(PACKAGE + ".")}
        graph[name] = deps - {name, "__init__", ""}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (empty: none)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_the_aclserver_core_has_no_import_cycle() -> None:
    graph = _graph()
    assert {"claim", "dispatch", "memory", "models", "backend", "quota"} <= set(graph)
    assert _cycle(graph) == [], " -> ".join(_cycle(graph))


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []
