"""The kube-scheduler extender (``flexnpu-dra extender``): ranks nodes by how full their NPUs are.

kube-scheduler has no scoring of DRA devices (the DynamicResources plugin scores only which
``firstAvailable`` subrequest was met), so pods that ask for NPUs spread by pod count. This
extender answers the ``prioritize`` verb of ``k8s.io/kube-scheduler/extender/v1``: an
``ExtenderArgs`` JSON (``pod``, and ``nodes`` or — with ``nodeCacheCapable`` — ``nodenames``) in,
a ``HostPriorityList`` (``[{"host", "score"}]``, scores 0..``MaxExtenderPriority`` = 10) out.
kube-scheduler multiplies a score by the extender's ``weight`` and by 10 and adds it to its
plugins' scores. The nodes it sends have passed every filter, so each fits the pod: **binpack**
scores the fullest highest, **spread** the emptiest (``dra_driver/placement.py`` ``node_score``).
The policy is ``--placement`` unless the pod's annotation ``npu.flexnpu.io/placement`` says
``binpack`` or ``spread``. A pod that asks for no claim and no extended resource gets 0
everywhere (no preference). No ``filter`` verb: the DynamicResources plugin already filters on
the devices themselves, and a second filter would only add a way to refuse pods.

Fill comes from watch-fed caches (``controller/allocations.py``): the allocated claims of this
driver and every node's ResourceSlices; a call makes no API request. Each change the caches see
recomputes the changed nodes' fill and both policies' scores on the watch's thread, so a call only
looks its nodes up in a table (it computes what is still pending, if it comes first). Before the caches have
listed once, every node scores 0 (no preference) rather than guess. kube-scheduler ignores a
prioritize error or timeout (the pod is placed by its own scores), so a down extender never
keeps a pod pending; ``ignorable: true`` in the scheduler configuration says the same for the
extender as a whole.

Routes: ``POST /prioritize``; ``GET /readyz`` (503 until the claim and slice watches first listed,
then 200: a pod is ready once its scores are); ``GET /healthz`` (200 while serving); ``GET /metrics``
(decisions by verb, policy and outcome; call latency). Each call is a trace span
(``flexnpu.extender.prioritize``) with the pod, the policy and the best node.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from controller import https
from controller.allocations import ClaimAllocations, DriverSlices
from controller.https import BadRequest, JsonHandler
from controller.kube import Kube
from dra_driver import liveness, placement
from dra_driver.config import ExtenderConfig
from dra_driver.errors import InvalidInput
from dra_driver.placement import Placement
from dra_driver.telemetry.tracing import Tracing

log = logging.getLogger("flexnpu.extender")

PRIORITIZE_PATH = "/prioritize"
READY_PATH = "/readyz"
HEALTH_PATH = "/healthz"
METRICS_PATH = "/metrics"
_NOT_DEVICES = ("cpu", "memory", "ephemeral-storage", "pods")


class NodeScores:
    """Node fill per node from the caches, recomputed only for pools that changed.

    **Parameters:**
    * claims - allocation results of the driver in every pool (``pool=None``).
    * slices - every node's slices of the driver.
    * default - the policy of pods without the annotation.
    * otlp_endpoint - where the call spans go over OTLP/HTTP (``--otlp-endpoint``; '' = nowhere).
    """

    def __init__(
        self, claims: ClaimAllocations, slices: DriverSlices, *, default: Placement, otlp_endpoint: str = ""
    ) -> None:
        self.claims, self.slices, self.default = claims, slices, default
        self._lock = threading.Lock()
        self._first = True
        self._dirty: set[str] = set()
        self._fill: dict[str, tuple[str, placement.NodeFill]] = {}  # pool -> (node, fill)
        self._scores: dict[Placement, dict[str, int]] = {p: {} for p in Placement}  # policy -> node -> score
        self._unknown = placement.node_scores(placement.NodeFill())
        self._metrics: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._shape: dict[
            str, tuple[list[Any], dict[str, placement.DeviceInfo], dict[int, placement.DieTotals]]
        ] = {}
        self.registry = CollectorRegistry()
        self.decisions = Counter(
            "flexnpu_extender_decisions",
            "extender calls by verb, policy and outcome (scored, no-npu, not-synced, bad-annotation)",
            ["verb", "policy", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "flexnpu_extender_call_seconds",
            "time to answer one extender call",
            ["verb"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5),
            registry=self.registry,
        )
        self.tracing = Tracing(Resource({"service.name": "flexnpu-extender"}), otlp_endpoint)

    def changed(self, pools_: frozenset[str]) -> None:
        """A cache saw these pools change: recompute their fills and scores now, on the watch's thread,
        so that a call finds them done (a call that comes first computes what is still pending)."""
        with self._lock:
            self._dirty |= pools_
        self._refresh()

    @property
    def synced(self) -> bool:
        return self.claims.synced.is_set() and self.slices.synced.is_set()

    def fills(self) -> dict[str, placement.NodeFill]:
        """Node name -> fill; only pools that changed since they were last computed are computed again."""
        with self._lock:
            self._refresh_locked()
            return {node: fill for node, fill in self._fill.values()}

    def scores(self, policy: Placement) -> dict[str, int]:
        """Node name -> this policy's score as computed so far (a copy; computes nothing itself)."""
        with self._lock:
            return dict(self._scores[policy])

    def _refresh(self) -> None:
        with self._lock:
            self._refresh_locked()

    def _refresh_locked(self) -> None:
        if not self._dirty and not self._first:
            return
        dirty, self._dirty = self._dirty, set()
        if self._first:
            dirty, self._first = dirty | set(self.slices.pool_names()), False
        for name in dirty:
            self._fill_pool(name)

    def _fill_pool(self, name: str) -> None:
        old = self._fill.get(name)
        if old is not None:
            for table in self._scores.values():
                table.pop(old[0], None)
        found = self.slices.pool(name)
        if found is None:
            self._fill.pop(name, None)
            self._shape.pop(name, None)
            return
        node, pool = found
        shape = self._shape.get(name)
        if shape is None or shape[0] != pool.slices:  # the slices changed: read devices and totals again
            shape = (pool.slices, placement.device_infos(pool), placement.die_totals(pool))
            self._shape[name] = shape
        usage = placement.die_usage(self.claims.results(name), shape[1])
        fill = placement.node_fill(shape[2], usage)
        self._fill[name] = (node, fill)
        for policy, score in placement.node_scores(fill).items():
            self._scores[policy][node] = score

    def prioritize(self, args: Any) -> list[dict[str, Any]]:
        """``ExtenderArgs`` -> ``HostPriorityList``; BadRequest when the body is not ExtenderArgs.

        The scores are read from the table the caches' changes keep (:meth:`changed`): a call
        computes nothing per node unless a change is still pending when it comes."""
        started, started_ns = time.perf_counter(), time.time_ns()
        pod, names = _args(args)
        policy, outcome = self._policy(pod)
        answer: list[dict[str, Any]]
        if not _asks_for_devices(pod):
            outcome, answer = "no-npu", [{"host": n, "score": 0} for n in names]
        elif not self.synced:
            outcome, answer = "not-synced", [{"host": n, "score": 0} for n in names]
        else:
            with self._lock:
                self._refresh_locked()
                table, unknown = self._scores[policy], self._unknown[policy]
                answer = [{"host": n, "score": table.get(n, unknown)} for n in names]
        best = str(max(answer, key=lambda h: int(h["score"]))["host"]) if answer else ""
        meta = pod.get("metadata") or {}
        self.tracing.tracer.start_span(
            "flexnpu.extender.prioritize",
            attributes={
                "k8s.pod.name": str(meta.get("name", "")),
                "k8s.namespace.name": str(meta.get("namespace", "")),
                "flexnpu.placement": str(policy),
                "flexnpu.extender.outcome": outcome,
                "flexnpu.extender.best_node": best,
                "flexnpu.extender.nodes": len(names),
            },
            start_time=started_ns,
        ).end()
        decisions, latency = self._metrics_for(str(policy), outcome)
        decisions.inc()
        latency.observe(time.perf_counter() - started)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("prioritize %s/%s (%s, %s): best %s of %d", meta.get("namespace"), meta.get("name"),
                      policy, outcome, best, len(names))  # fmt: skip
        return answer

    def _metrics_for(self, policy: str, outcome: str) -> tuple[Any, Any]:
        """The (decisions, latency) children of one call's labels, looked up once."""
        key = (policy, outcome)
        found = self._metrics.get(key)
        if found is None:
            found = (self.decisions.labels("prioritize", policy, outcome), self.latency.labels("prioritize"))
            self._metrics[key] = found
        return found

    def _policy(self, pod: Mapping[str, Any]) -> tuple[Placement, str]:
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(placement.ANNOTATION)
        if raw is None:
            return self.default, "scored"
        try:
            return Placement.parse(raw, field=f"metadata.annotations[{placement.ANNOTATION}]"), "scored"
        except InvalidInput as err:
            meta = pod.get("metadata") or {}
            log.warning("pod %s/%s: %s; using %s", meta.get("namespace"), meta.get("name"), err, self.default)
            return self.default, "bad-annotation"


def _args(args: Any) -> tuple[Mapping[str, Any], list[str]]:
    if not isinstance(args, dict) or not isinstance(args.get("pod"), dict):
        raise BadRequest("malformed ExtenderArgs: field pod: expected an object")
    names = args.get("nodenames")
    if names is None:
        items = (args.get("nodes") or {}).get("items")
        if not isinstance(items, list):
            raise BadRequest("malformed ExtenderArgs: one of nodenames, nodes.items is required")
        names = [((n or {}).get("metadata") or {}).get("name") for n in items]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise BadRequest("malformed ExtenderArgs: field nodenames: expected a list of node names")
    return args["pod"], names


def _asks_for_devices(pod: Mapping[str, Any]) -> bool:
    """Whether the pod asks for a ResourceClaim or an extended resource (the whole-die class's name)."""
    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):
        return True
    for ctr in _containers(spec):
        res = ctr.get("resources") or {}
        for name in (*(res.get("limits") or {}), *(res.get("requests") or {})):
            if name not in _NOT_DEVICES and not str(name).startswith("hugepages-"):
                return True
    return False


def _containers(spec: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    return [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]


class Extender:
    """The extender process: the caches' watches and the HTTPS server."""

    def __init__(self, settings: ExtenderConfig, *, kube: Kube | None = None) -> None:
        self.settings = settings
        self.kube = kube or Kube.from_config(settings.kubeconfig)
        self.live = liveness.Liveness()
        self.claims = ClaimAllocations(self.kube, driver=settings.driver_name, live=self.live)
        self.slices = DriverSlices(self.kube, driver=settings.driver_name, live=self.live)
        self.scores = NodeScores(
            self.claims, self.slices, default=settings.placement, otlp_endpoint=settings.otlp_endpoint
        )
        self.claims.on_change = self.slices.on_change = self.scores.changed
        self.port: int | None = None

    def serve(self, stop: threading.Event, ready: threading.Event | None = None) -> None:
        for name, cache in (("extender-claims", self.claims), ("extender-slices", self.slices)):
            threading.Thread(target=cache.run, args=(stop,), name=name, daemon=True).start()

        def prioritize(doc: Any, _handler: JsonHandler) -> Any:
            return self.scores.prioritize(doc)

        def readyz() -> tuple[str, str]:
            if not self.scores.synced:
                raise https.Unavailable("listing claims and slices")
            return "text/plain", "ok\n"

        def bound(port: int) -> None:
            self.port = port

        https.serve(
            name="extender",
            what="ExtenderArgs",
            host=self.settings.host,
            port=self.settings.port,
            tls_cert=self.settings.tls_cert,
            tls_key=self.settings.tls_key,
            post_routes={PRIORITIZE_PATH: prioritize},
            get_routes={
                READY_PATH: readyz,
                HEALTH_PATH: lambda: ("text/plain", "ok\n"),
                METRICS_PATH: lambda: (
                    "text/plain; version=0.0.4",
                    generate_latest(self.scores.registry).decode(),
                ),
            },
            stop=stop,
            ready=ready,
            bound=bound,
        )
        self.scores.tracing.shutdown()  # sends the spans still batched
        self.kube.close()


def run(settings: ExtenderConfig, stop: threading.Event | None = None) -> int:
    """The process body of ``flexnpu-dra extender``: serve until SIGTERM/SIGINT."""
    return https.run_until_signal(lambda stop_: Extender(settings).serve(stop_), stop)
