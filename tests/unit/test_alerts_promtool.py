"""The chart's alerts pass Prometheus's own tools: ``promtool check rules`` on monitoring/alerts.yaml,
and ``promtool test rules`` on monitoring/alerts.test.yaml, which fires every alert (and, on a
healthy node, none). That the test file's input series are what the node exports is checked against
a real scrape (tests/integration/test_usage_metrics.py).

promtool comes from Debian's ``prometheus`` package; scripts/test.sh puts it beside the venv's Python.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helmchart import CHART

MONITORING = CHART / "monitoring"
ALERTS = MONITORING / "alerts.yaml"
ALERT_TESTS = MONITORING / "alerts.test.yaml"


@pytest.fixture(scope="module")
def promtool() -> Path:
    found = shutil.which("promtool") or shutil.which("promtool", path=str(Path(sys.executable).parent))
    assert found, "promtool is missing: scripts/test.sh installs it (Debian's prometheus package)"
    return Path(found)


def _run(promtool: Path, *args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def _alerts() -> set[str]:
    return {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}


def test_promtool_checks_the_rules(promtool: Path) -> None:
    out = _run(promtool, "check", "rules", ALERTS.name)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in out.stdout


def test_promtool_unit_tests_pass(promtool: Path) -> None:
    out = _run(promtool, "test", "rules", ALERT_TESTS.name)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_is_fired_and_quiet_in_the_unit_tests() -> None:
    doc = yaml.safe_load(ALERT_TESTS.read_text())
    assert doc["rule_files"] == [ALERTS.name]
    cases = [t for case in doc["tests"] for t in case["alert_rule_test"]]
    fired = {t["alertname"] for t in cases if t["exp_alerts"]}
    quiet = {t["alertname"] for t in cases if not t["exp_alerts"]}
    assert fired == _alerts(), f"alerts no promtool test fires: {sorted(_alerts() - fired)}"
    assert quiet == _alerts(), f"alerts no promtool test expects quiet: {sorted(_alerts() - quiet)}"


def test_promtool_catches_a_wrong_expectation(promtool: Path, tmp_path: Path) -> None:
    """The unit tests can fail: the same file with one expected severity changed does."""
    shutil.copy(ALERTS, tmp_path / ALERTS.name)
    text = ALERT_TESTS.read_text()
    wrong = text.replace(
        "{severity: critical, node: node-a, loop: publisher}",
        "{severity: info, node: node-a, loop: publisher}",
    )
    assert wrong != text
    (tmp_path / ALERT_TESTS.name).write_text(wrong)
    out = _run(promtool, "test", "rules", ALERT_TESTS.name, cwd=tmp_path)
    assert out.returncode != 0 and "FlexNPULoopStalled" in out.stdout + out.stderr
