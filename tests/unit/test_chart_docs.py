"""The chart, its schema, values.yaml and the documentation agree: each Helm value flag a document shows
(``--set``, ``--set-json``, ``-f``, and ``a.b: value`` in prose) passes Helm's own schema check and
renders valid objects; ``helm lint --strict`` is clean; values.yaml comments name every value an
enum of the schema allows; the schema knows every key of values.yaml and nothing else."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests import helmchart
from tests.helmchart import CHART, ROOT
from tests.unit.test_manifests import check_shape

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
# The top-level README, every docs/ page and every example's README.
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "manifests" / "examples").glob("*/README.md")),
]
INVOCATIONS = [f for doc in DOCS for f in helmchart.documented_flags(doc)]


def test_the_docs_show_value_flags() -> None:
    """The extraction finds what the documents are known to show (so the table below is not empty)."""
    shown = {(flag, arg.split("=")[0].strip("'")) for inv in INVOCATIONS for flag, arg in inv.flags}
    assert ("--set", "plugin.defaultMode") in shown
    assert ("--set", "emulated.enabled") in shown
    assert ("--set-json", "emulated.inventory.chips") in shown
    assert ("--yaml-value", "plugin.defaultMode") in shown
    # the install the README and docs/install.md show: a local image on every node
    assert ("--set", "image.pullPolicy") in shown


@pytest.mark.parametrize("invocation", [pytest.param(i, id=i.label) for i in INVOCATIONS])
def test_documented_values_pass_the_schema_and_render(invocation: helmchart.ValueFlags) -> None:
    values = invocation.values(ROOT)
    merged = helmchart.merge(helmchart.chart_values(), values)
    helmchart.validate_values(merged)  # Helm's own schema check (raises HelmValuesError)
    docs = helmchart.render_chart(values)  # helm template, which checks the schema again
    for doc in docs:
        check_shape(doc, f"{invocation.where}: {doc.get('kind')}")
    assert sum(d["kind"] == "DaemonSet" for d in docs) == 2


@pytest.mark.parametrize(
    "mode",
    [pytest.param(m, id=m) for m in SCHEMA["properties"]["plugin"]["properties"]["defaultMode"]["enum"]],
)
def test_every_mode_reaches_the_plugin(mode: str) -> None:
    docs = helmchart.render_chart({"plugin": {"defaultMode": mode}})
    (plugin,) = [d for d in docs if d["kind"] == "DaemonSet" and "plugin" in d["metadata"]["name"]]
    (ctr,) = plugin["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    assert env["FLEXNPU_DEFAULT_MODE"] == mode


def test_schema_modes_are_the_plugin_modes() -> None:
    from dra_driver.devices import DieMode

    assert set(SCHEMA["properties"]["plugin"]["properties"]["defaultMode"]["enum"]) == {
        m.value for m in DieMode
    }


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="defaults"),
        pytest.param({"emulated": {"enabled": True}}, id="emulated"),
        pytest.param(
            {"monitoring": {k: {"enabled": True} for k in ("dashboard", "prometheusRule", "podMonitor")}},
            id="monitoring",
        ),
    ],
)
def test_helm_lint_is_clean(values: dict[str, Any]) -> None:
    assert helmchart.lint(values) == []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"plugin": {"defaultMode": "shared"}}, "defaultMode", id="unknown-mode"),
        pytest.param({"plugin": {"defautMode": "all"}}, "defautMode", id="misspelled-plugin-key"),
        pytest.param({"daemon": {"loglevel": "INFO"}}, "loglevel", id="misspelled-daemon-key"),
    ],
)
def test_helm_refuses_bad_values(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        helmchart.render_chart(values)


def _comment_above(lines: list[str], index: int) -> str:
    """The comment lines directly above ``lines[index]`` and the line's own trailing comment."""
    out = [lines[index].partition("#")[2]]
    i = index - 1
    while i >= 0 and lines[i].strip().startswith("#"):
        out.append(lines[i].strip().lstrip("#"))
        i -= 1
    return " ".join(out)


def _enums(schema: dict[str, Any], path: str = "") -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for key, prop in schema.get("properties", {}).items():
        sub = SCHEMA["definitions"][prop["$ref"].rsplit("/", 1)[1]] if "$ref" in prop else prop
        here = f"{path}.{key}" if path else key
        if "enum" in sub:
            found.append((here, sub["enum"]))
        found.extend(_enums(sub, here))
    return found


@pytest.mark.parametrize(("path", "allowed"), [pytest.param(p, e, id=p) for p, e in _enums(SCHEMA)])
def test_values_comments_name_every_allowed_value(path: str, allowed: list[str]) -> None:
    lines = (CHART / "values.yaml").read_text().split("\n")
    indent, index = 0, -1
    for part in path.split("."):
        pattern = re.compile(rf"^{' ' * indent}{re.escape(part)}:")
        index = next(i for i in range(index + 1, len(lines)) if pattern.match(lines[i]))
        indent += 2
    comment = _comment_above(lines, index)
    missing = [v for v in allowed if not re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-])", comment)]
    assert not missing, f"values.yaml's comment on {path} does not name {missing}"


def _keys(values: Any, path: str = "") -> set[str]:
    if not isinstance(values, dict):
        return set()
    out = set()
    for key, sub in values.items():
        here = f"{path}.{key}" if path else key
        out.add(here)
        if key not in ("inventory", "labels", "resources", "nodeSelector"):  # free-form documents
            out |= _keys(sub, here)
    return out


def _schema_keys(schema: dict[str, Any], path: str = "") -> set[str]:
    out = set()
    props = dict(schema.get("properties", {}))
    for part in schema.get("allOf", []):
        ref = part["$ref"].rsplit("/", 1)[1]
        props.update(SCHEMA["definitions"][ref]["properties"])
    for key, sub in props.items():
        here = f"{path}.{key}" if path else key
        out.add(here)
        if "properties" in sub or "allOf" in sub:
            out |= _schema_keys(sub, here)
    return out


def test_schema_and_values_know_the_same_keys() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    in_values = _keys(values)
    in_schema = {k for k in _schema_keys(SCHEMA) if k.rsplit(".", 1)[0] not in ("emulated.inventory",)}
    assert in_values - in_schema == set(), "values.yaml keys the schema does not describe"
    assert in_schema - in_values == set(), "schema keys values.yaml does not show (with a default)"


def test_docs_name_files_that_exist() -> None:
    for inv in INVOCATIONS:
        for flag, arg in inv.flags:
            if flag in ("-f", "--values"):
                assert (ROOT / Path(arg.strip("'\""))).is_file(), inv.where
