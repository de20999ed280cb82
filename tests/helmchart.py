"""The Helm chart as Helm itself sees it: values, schema, rendering and lint through Helm's own Go
SDK (the ``helm-python-sdk`` wheel from PyPI bundles it as a C library, so no ``helm`` binary is
needed), and the Helm value flags (``--set``, ``--set-string``, ``--set-json``, ``-f``) that the
READMEs show, parsed with Helm's own parsers.

Owns no assertion: the tests in ``tests/unit/test_manifests.py`` and ``test_chart_docs.py`` do;
``scripts/render_manifest.py`` renders the plain manifest with it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "manifests" / "helm" / "flexnpu-dra-driver"
RELEASE = {"Name": "flexnpu-dra-driver", "Namespace": "flexnpu-system", "Service": "Helm"}
PLAIN = {"webhook.enabled": False}
"""The overrides the plain manifest is rendered with (``scripts/render_manifest.py``)."""

# Helm's severities (pkg/lint/support): info 1, warning 2, error 4.
LINT_WARNING = 2


@cache
def _chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def chart_values(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """values.yaml with ``dotted.path: value`` overrides set (parents must exist)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for dotted, value in (overrides or {}).items():
        node = values
        *parents, last = dotted.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    return values


def merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of user values over others: maps merge, anything else replaces."""
    out = copy.deepcopy(dict(base))
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def render_chart(values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """``helm template`` of the chart (schema checked by Helm first): every object it renders,
    hooks included, in template order."""
    rendered = _chart().render(
        dict(values) if values is not None else None,
        name=RELEASE["Name"],
        namespace=RELEASE["Namespace"],
        is_install=True,
    )
    docs: list[dict[str, Any]] = []
    for path in sorted(rendered):
        docs.extend(d for d in yaml.safe_load_all(rendered[path]) if d)
    return docs


def validate_values(values: Mapping[str, Any]) -> None:
    """Helm's own check of ``values.schema.json`` (raises ``helm.HelmValuesError``)."""
    _chart().validate_schema(dict(values))


def lint(values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """``helm lint --strict`` findings of warning severity or worse."""
    report = helm.lint(
        CHART, dict(values) if values is not None else None, strict=True, kube_version="1.36.2"
    )
    return [m for m in report["messages"] if m["severity"] >= LINT_WARNING]


# -- value flags in the documentation -------------------------------------------------------------

_FLAG = re.compile(
    r"(?P<flag>--set-json|--set-string|--set-literal|--set|--values|-f)[ =]"
    r"(?P<arg>'[^']*'|\"[^\"]*\"|[^\s`'\"]+)"
)
_HELM_COMMAND = re.compile(r"^helm (?:install|upgrade|template)\b")
_FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.M | re.S)
_INLINE = re.compile(r"`([^`]+)`")
# `plugin.defaultMode: all` in prose: a value given in values-file form.
_INLINE_VALUE = re.compile(r"^(?P<path>[a-z][A-Za-z]*(?:\.[A-Za-z]+)+): (?P<value>.+)$")


@dataclass(frozen=True, slots=True)
class ValueFlags:
    """One invocation's value flags, as a README shows them."""

    where: str  # file:line, for messages
    flags: tuple[tuple[str, str], ...]
    doc: str = ""  # the file, relative to the repository
    shown: str = ""  # what the file shows, as a test ID says it

    @property
    def label(self) -> str:
        """What this invocation checks, without line numbers: ``file: what it shows``."""
        return f"{self.doc}: {self.shown}"

    def values(self, files_root: Path) -> dict[str, Any]:
        """The user values Helm makes of these flags, in order (later flags win)."""
        out: dict[str, Any] = {}
        for flag, arg in self.flags:
            out = merge(out, _parse(flag, arg, files_root))
        return out


def _unquote(arg: str) -> str:
    return arg[1:-1] if len(arg) >= 2 and arg[0] == arg[-1] and arg[0] in "'\"" else arg


def _parse(flag: str, arg: str, files_root: Path) -> dict[str, Any]:
    text = _unquote(arg)
    if flag == "--set":
        return helm.parse_set_string(text)
    if flag == "--set-string":
        return helm.parse_set_string_values(text)
    if flag == "--set-json":
        return helm.parse_set_json(text)
    if flag == "--set-literal":
        return helm.parse_set_literal(text)
    if flag == "--yaml-value":  # `a.b: value` in prose, as values.yaml would hold it
        path, _, value = text.partition("=")
        node: Any = yaml.safe_load(value)
        for part in reversed(path.split(".")):
            node = {part: node}
        return dict(node)
    loaded = yaml.safe_load((files_root / text).read_text())  # -f / --values: a file of the repository
    return dict(loaded or {})


def documented_flags(path: Path) -> Iterator[ValueFlags]:
    """Every ``helm install|upgrade|template`` command of a Markdown file (in a code block, with its
    continuation lines, or inline), and every inline `--set …` or `a.b: value` span."""
    text = path.read_text().replace("\\\n", " ")
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path

    def line_of(pos: int, source: str = text) -> int:
        return source.count("\n", 0, pos) + 1

    def flags_of(command: str) -> tuple[tuple[str, str], ...]:
        return tuple((m["flag"], m["arg"]) for m in _FLAG.finditer(command))

    def command(line: str) -> str:
        """A helm command as an ID shows it: its verb and its value flags."""
        flags = " ".join(f"{f} {a}" for f, a in flags_of(line))
        return f"{' '.join(line.split()[:2])} {flags or '(no value flags)'}"

    for block in _FENCE.finditer(text):
        offset = block.start(1)
        for line in block[1].split("\n"):
            if _HELM_COMMAND.match(line.strip()):
                yield ValueFlags(
                    where=f"{name}:{line_of(offset)} (helm command)",
                    flags=flags_of(line),
                    doc=str(name),
                    shown=command(line.strip()),
                )
            offset += len(line) + 1
    prose = _FENCE.sub(lambda m: "\n" * m[0].count("\n"), text)
    for span in _INLINE.finditer(prose):
        words = " ".join(span[1].split())
        where = f"{name}:{line_of(span.start(), prose)} `{words}`"
        if _HELM_COMMAND.match(words):
            yield ValueFlags(where=where, flags=flags_of(words), doc=str(name), shown=command(words))
        elif "--set" in words:
            yield ValueFlags(where=where, flags=flags_of(words), doc=str(name), shown=words)
        elif (m := _INLINE_VALUE.match(words)) and m["path"].split(".")[0] in chart_values():
            flags = (("--yaml-value", f"{m['path']}={m['value']}"),)
            yield ValueFlags(where=where, flags=flags, doc=str(name), shown=words)
