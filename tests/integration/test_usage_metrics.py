"""Per-vNPU usage on the node's metrics endpoint, and the chart's dashboard and alerts against a real scrape.

A node process with a daemon serves a share to a pod; the pod's client allocates memory and runs a kernel; then
``/metrics`` is scraped. The vNPU series carry the pod, claim and quotas and what was used, the die series what is
allocated. Every expression of monitoring/dashboard.json and monitoring/alerts.yaml names only series of that
scrape (and only labels they carry), so no panel or alert of the chart watches a metric that does not exist; and
every input series of the alerts' promtool tests (monitoring/alerts.test.yaml) is a series of that scrape with the
label names it carries, so the alerts are tested on what the driver really exports.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dra_driver import wirefiles
from dra_driver.errors import ErrorCode
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_client.session import Session
from flexnpu_testing.waiting import wait_for
from flexnpu_wire import clientconf
from tests.integration.conftest import NAMESPACE, NODE, Node
from tests.integration.lifecycle_helpers import pod_ref, share_request

CHART = Path(__file__).resolve().parents[2] / "manifests" / "helm" / "flexnpu-dra-driver"
DASHBOARD = CHART / "monitoring" / "dashboard.json"
ALERTS = CHART / "monitoring" / "alerts.yaml"
ALERT_TESTS = CHART / "monitoring" / "alerts.test.yaml"
MI = 1024 * 1024

# -- PromQL: which series and labels an expression names ----------------------------------------

_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "or",
    "and",
    "unless",
    "bool",
    "offset",
}
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_SELECTOR = re.compile(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
_IDENT = re.compile(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """Series names in a PromQL expression (functions, keywords, label names and Grafana variables left out)."""
    text = _GROUPING.sub(" ", expr)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\$\{?\w+\}?", " ", text)
    names = set()
    for m in _IDENT.finditer(text):
        if m.group(2) or m.group(1) in _KEYWORDS:
            continue  # a function call or a keyword
        names.add(m.group(1))
    return names


def selector_labels(expr: str) -> dict[str, set[str]]:
    """Label names each ``metric{...}`` selector of the expression matches on."""
    out: dict[str, set[str]] = {}
    for m in _SELECTOR.finditer(expr):
        labels = {part.split("=")[0].strip().rstrip("!~") for part in m.group(2).split(",") if part.strip()}
        out.setdefault(m.group(1), set()).update(labels)
    return out


def dashboard_expressions() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets") or []]
    for var in doc["templating"]["list"]:
        if var.get("type") == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
            assert m, f"template variable {var['name']}: {query}"
            exprs.append(m.group(1))
    return exprs


def alert_expressions() -> list[str]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def test_promql_name_extraction() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, node) (rate(a_bucket{node=~"$node", x="y{z}"}[$__rate_interval])))'
        " / clamp_min(b_total, 1e-9) > 0.1 or max by (die) (c / d) >= 95"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c", "d"}
    assert selector_labels(expr) == {"a_bucket": {"node", "x"}}
    assert metric_names(["label_values", "m, node)"][1].split(",", maxsplit=1)[0]) == {"m"}


# -- the node-level scrape -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class Scrape:
    samples: list[Any]

    @property
    def names(self) -> set[str]:
        return {s.name for s in self.samples}

    def labels_of(self, name: str) -> set[str]:
        return {k for s in self.samples if s.name == name for k in s.labels}

    def value(self, name: str, **labels: str) -> float:
        found = [s.value for s in self.samples if s.name == name and labels.items() <= s.labels.items()]
        assert len(found) == 1, f"{name}{labels}: {found}"
        return float(found[0])


def scrape(port: int) -> Scrape:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return Scrape([s for fam in text_string_to_metric_families(text) for s in fam.samples])


def host_conf(node: Node, uid: str, tmp: Path) -> Path:
    """The claim's client.conf with the container paths mapped to host paths, as its CDI mounts map them."""
    conf = wirefiles.load_client_conf(node.dirs["run"] / "claims" / uid / "client.conf")
    spec = json.loads(next(p for p in node.cdi_specs() if uid in p.name).read_text())
    shm = next(m["hostPath"] for m in spec["containerEdits"]["mounts"] if m["containerPath"] == conf.shm_dir)
    unix = str(Path(shm) / Path(conf.endpoints.unix).name) if conf.endpoints.unix else None
    mapped = dataclasses.replace(
        conf, shm_dir=shm, endpoints=clientconf.Endpoints(unix=unix, tcp=conf.endpoints.tcp)
    )
    path = tmp / "client.conf"
    path.write_text(clientconf.render(mapped))
    return path


@pytest.fixture
def served(node_factory: Callable[..., Node], tmp_path: Path) -> Iterator[tuple[Node, int, str, int]]:
    """A node with a daemon and one 256Mi/20 share reserved for pod 'trainer', used a little by its client."""
    port = _free_port()
    node = node_factory(daemon=True, FLEXNPU_METRICS_PORT=str(port), FLEXNPU_DEFAULT_MODE="both").start()
    wait_for(node.devices, what="published devices")
    uid = node.create_claim("train-vnpu", [share_request(memory="256Mi", compute="20")])
    claim = node.scheduler.allocate(NAMESPACE, "train-vnpu", NODE, reserved_for=[pod_ref("trainer")])
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    die = int(result["device"].removeprefix("vnpu-"))
    assert node.kubelet is not None
    assert node.kubelet.prepare([ClaimRef(NAMESPACE, uid, "train-vnpu")])[uid].error == ""
    with Session.open(host_conf(node, uid, tmp_path)) as session:
        session.init()
        session.set_device(0)
        session.malloc(64 * MI)
        stream = session.create_stream()
        session.launch_kernel(stream, 30_000)
        session.synchronize_stream(stream)
        yield node, port, uid, die


def test_vnpu_usage_is_exported_per_pod_and_die(served: tuple[Node, int, str, int]) -> None:
    node, port, uid, die = served
    vnpu = {"namespace": NAMESPACE, "pod": "trainer", "claim": "train-vnpu", "die": str(die), "v_dev_id": "0"}

    def kernel_counted() -> Scrape | None:
        s = scrape(port)
        ok = "flexnpu_vnpu_pod_kernels_total" in s.names
        return s if ok and s.value("flexnpu_vnpu_pod_kernels_total", **vnpu) >= 1 else None

    s = wait_for(kernel_counted, what="the kernel in the ledger")
    assert s.value("flexnpu_vnpu_pod_total_memory_bytes", **vnpu, node=NODE) == 256 * MI
    assert s.value("flexnpu_vnpu_pod_used_memory_bytes", **vnpu) >= 64 * MI
    assert s.value("flexnpu_vnpu_pod_compute_quota_percent", **vnpu) == 20
    assert s.value("flexnpu_vnpu_pod_compute_seconds_total", **vnpu) >= 0.03
    assert s.value("flexnpu_vnpu_pod_sessions", **vnpu) == 1  # the client's session is open
    assert s.labels_of("flexnpu_vnpu_pod_total_memory_bytes") >= {"vdie_id", "driver", "node"}
    claim_labels = {k: vnpu[k] for k in ("namespace", "pod", "claim")}
    assert s.value("flexnpu_aclserver_up", **claim_labels) == 1
    assert s.value("flexnpu_aclserver_restarts_total", **claim_labels) == 0
    assert s.value("flexnpu_die_shares", die=str(die)) == 1
    assert s.value("flexnpu_die_share_limit", die=str(die)) == 63
    assert s.value("flexnpu_die_compute_allocated_percent", die=str(die)) == 20
    assert s.value("flexnpu_die_memory_allocated_bytes", die=str(die)) == 256 * MI
    other = next(d for d in (0, 1) if d != die)
    assert s.value("flexnpu_die_shares", die=str(other)) == 0
    assert s.value("flexnpu_vnpu_collect_ok") == 1

    # Unprepared: the vNPU's series go, the die is free again.
    assert node.kubelet is not None
    assert node.kubelet.unprepare([ClaimRef(NAMESPACE, uid, "train-vnpu")]) == {uid: ""}
    after = scrape(port)
    assert "flexnpu_vnpu_pod_total_memory_bytes" not in after.names
    assert after.value("flexnpu_die_shares", die=str(die)) == 0


def test_every_dashboard_and_alert_expression_names_exported_series(
    served: tuple[Node, int, str, int],
) -> None:
    node, port, _uid, _die = served
    assert node.kubelet is not None
    node.kubelet.prepare([ClaimRef(NAMESPACE, "0000aaaa-0000-4000-8000-000000000000", "missing")])  # an error
    s = wait_for(
        lambda: (x := scrape(port)) and "flexnpu_vnpu_pod_compute_seconds_total" in x.names and x,
        what="the compute counter",
    )
    exprs = {"dashboard": dashboard_expressions(), "alerts": alert_expressions()}
    assert len(exprs["dashboard"]) >= 20 and len(exprs["alerts"]) >= 6
    for where, found in exprs.items():
        for expr in found:
            names = metric_names(expr)
            assert names, f"{where}: no metric in {expr!r}"
            missing = names - s.names
            assert not missing, f"{where}: {expr!r} names {sorted(missing)}, not exported by the node"
            for name, labels in selector_labels(expr).items():
                unknown = labels - s.labels_of(name)
                assert not unknown, f"{where}: {name} has no label(s) {sorted(unknown)} in {expr!r}"
    # The alerts cover what the issue asks for.
    alerts = " ".join(exprs["alerts"])
    for needed in (
        "flexnpu_dra_prepare_requests_total",
        "flexnpu_dra_residuals_found_total",
        "flexnpu_dra_loop_since_last_pass_seconds",
        "flexnpu_aclserver_restarts_total",
        "flexnpu_die_share_limit",
    ):
        assert needed in alerts, needed


_SERIES = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>.*)\}$")


def alert_test_series() -> list[tuple[str, dict[str, str]]]:
    """(name, labels) of every input series of the promtool tests; empty labels are absent ones."""
    doc = yaml.safe_load(ALERT_TESTS.read_text())
    out = []
    for case in doc["tests"]:
        for series in case["input_series"]:
            m = _SERIES.match(series["series"])
            assert m, series["series"]
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"]))
            out.append((m["name"], {k: v for k, v in labels.items() if v}))
    return out


def test_alert_tests_use_exported_series(served: tuple[Node, int, str, int]) -> None:
    node, port, _uid, _die = served
    assert node.kubelet is not None
    node.kubelet.prepare([ClaimRef(NAMESPACE, "0000aaaa-0000-4000-8000-000000000000", "missing")])  # an error
    s = wait_for(
        lambda: (x := scrape(port)) and "flexnpu_vnpu_pod_compute_seconds_total" in x.names and x,
        what="the compute counter",
    )
    series = alert_test_series()
    assert len(series) >= 13
    codes = {c.value for c in ErrorCode}
    for name, labels in series:
        assert name in s.names, f"alerts.test.yaml feeds {name}, which the node does not export"
        exported = [{k: v for k, v in x.labels.items() if v} for x in s.samples if x.name == name]
        shapes = {frozenset(x) for x in exported}
        assert frozenset(labels) in shapes, (
            f"alerts.test.yaml's {name} has labels {sorted(labels)}; the node exports {sorted(map(sorted, shapes))}"
        )
        for label in ("result", "loop", "kind"):  # values from a fixed set: one the node exports
            if label in labels:
                assert labels[label] in {x.get(label) for x in exported}, (name, label, labels[label])
        if "error_type" in labels:
            assert labels["error_type"] in codes, labels["error_type"]
