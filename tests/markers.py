"""The ``root`` and ``podman`` markers, checked mechanically at collection (hooked in ``tests/conftest.py``).

What "needs root" and "needs podman" mean here, decided from the source, not from the machine (CI
runs everything as root, so running a test cannot tell):

* A test's **reach** is its own function, every fixture function in its closure that is not
  installed code (the standard library, site-packages), and, transitively, the module-level functions of those modules that they
  call by name.
* It **needs root** when its reach runs a root-only operation: ``mount``/``umount``, creating or
  entering a network namespace (``ip netns add``, pyroute2 ``netns.create``/``NetNS``), or podman.
* It **needs podman** when its reach uses the ``podman`` or ``built_image`` fixture or starts
  ``podman`` itself.

A test that needs root (podman) must carry ``@pytest.mark.root`` (``podman``); a test that carries
one must need it; ``podman`` implies ``root``. A violation stops the collection with a message that
names the test and the rule. What this cannot see: root needed only inside a process a test starts
(the node process creating its host link, the daemon mounting a tmpfs) — those processes degrade
without root and their tests stay unmarked; the marker names what the *test* does as root.

At run time a ``root`` test on a non-root machine is skipped with the reason, except under ``CI``,
where it fails (CI must run as root).
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

_INSTALLED = tuple(Path(p).resolve() for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
"""Where installed code lives (the standard library, site-packages): not the tests' own source."""
PODMAN_FIXTURES = frozenset({"podman", "built_image"})
ROOT_OPERATION = re.compile(
    r"""["'](?:u?mount)["']"""  # subprocess.run(["mount", ...]) / ["umount", ...]
    r"""|["']netns["']\s*,\s*["'](?:add|exec)["']"""  # ip netns add / exec
    r"""|\bnetns\.create\(|\bNetNS\("""  # pyroute2
)
PODMAN_OPERATION = re.compile(r"""\bPodman\(|["']podman["']\s*,""")


class MarkerError(pytest.UsageError):
    """A test's markers disagree with what its source does."""


def check(items: Iterable[pytest.Item]) -> None:
    """Raise :class:`MarkerError` listing every collected test whose markers break a rule."""
    problems = [p for item in items if isinstance(item, pytest.Function) for p in problems_of(item)]
    if problems:
        raise MarkerError("marker rules (tests/markers.py):\n  " + "\n  ".join(problems))


def problems_of(item: pytest.Function) -> list[str]:
    marked = {m.name for m in item.iter_markers()}
    root, podman = _needs(item)
    out = []
    if podman and "podman" not in marked:
        out.append(f"{item.nodeid}: runs podman but is not marked podman")
    if "podman" in marked and not podman:
        out.append(f"{item.nodeid}: marked podman but never runs podman")
    if "podman" in marked and "root" not in marked:
        out.append(f"{item.nodeid}: marked podman but not root (podman runs rootful here)")
    if root and "root" not in marked:
        out.append(f"{item.nodeid}: needs root (mount, network namespace or podman) but is not marked root")
    if "root" in marked and not root:
        out.append(f"{item.nodeid}: marked root but does nothing that needs root")
    return out


def skip_unless_root(item: pytest.Item) -> None:
    """At setup: a ``root`` test without root is skipped, or fails under CI."""
    if item.get_closest_marker("root") is None or os.geteuid() == 0:
        return
    message = f"{item.nodeid} needs root (mount, network namespace or podman)"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI is set and must run as root")
    pytest.skip(message)


def _needs(item: pytest.Function) -> tuple[bool, bool]:
    """(needs root, needs podman) from the test's reach (see the module docstring)."""
    functions: list[Callable[..., Any]] = [item.obj]
    info = getattr(item, "_fixtureinfo", None)
    for name in item.fixturenames:
        for definition in (getattr(info, "name2fixturedefs", {}) or {}).get(name, ()):
            func = getattr(definition, "func", None)
            if func is not None:
                functions.append(inspect.unwrap(func))
    podman = bool(set(item.fixturenames) & PODMAN_FIXTURES)
    root = podman
    seen: set[Callable[..., Any]] = set()
    while functions:
        func = functions.pop()
        if func in seen:
            continue
        seen.add(func)
        facts = _facts(func)
        root, podman = root or facts.root, podman or facts.podman
        functions.extend(facts.callees)
    return root or podman, podman


@dataclass(frozen=True)
class _Facts:
    root: bool
    podman: bool
    callees: tuple[Callable[..., Any], ...]


_NONE = _Facts(root=False, podman=False, callees=())
_FACTS: dict[Callable[..., Any], _Facts] = {}


def _facts(func: Callable[..., Any]) -> _Facts:
    """What one repository function does itself, and whom in its module it calls (memoised)."""
    if func in _FACTS:
        return _FACTS[func]
    module = sys.modules.get(getattr(func, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    facts = _NONE
    if module is not None and path is not None and not _installed(Path(path)):
        source = _source(func)
        facts = _Facts(
            root=bool(ROOT_OPERATION.search(source)),
            podman=bool(PODMAN_OPERATION.search(source)),
            callees=tuple(_callees(source, module)),
        )
    _FACTS[func] = facts
    return facts


def _installed(path: Path) -> bool:
    resolved = path.resolve()
    return any(resolved.is_relative_to(root) for root in _INSTALLED)


def _source(func: Callable[..., Any]) -> str:
    try:
        return textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError):
        return ""


def _callees(source: str, module: ModuleType) -> list[Callable[..., Any]]:
    """Module-level functions (and classes' methods) of ``module`` that ``source`` calls by name."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out: list[Callable[..., Any]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            target = getattr(module, node.func.id, None)
            if inspect.isfunction(target):
                out.append(target)
            elif inspect.isclass(target):
                out.extend(f for f in vars(target).values() if inspect.isfunction(f))
    return out
