"""Per-vNPU usage metrics of a node: what each pod's vNPU uses of its quota, read at scrape time.

Collected from the aclservers through the daemon (``DaemonClient.list``: quotas, memory in use, die time used,
sessions, process state, restarts) when Prometheus scrapes the node's metrics endpoint;
``100 * rate(flexnpu_vnpu_pod_compute_seconds_total[1m])`` is the percent of its die a vNPU uses. Kernel counts
(and die time, from a daemon that does not report it) come from the same place the daemon reads its figures:
the per-die ledgers the aclservers write under ``<shm dir>/.ledger``, read through the ``ledger`` reader the node
process passes in (``flexnpu_runtime/aclserver/ledger.py`` ``read_entries``; this module imports no runtime module; a
missing ledger reports nothing). The pods come from each claim's
``status.reservedFor`` (cached per claim, re-read after ``POD_CACHE_SECONDS``). The node process installs this
collector into its :class:`~dra_driver.telemetry.Telemetry` (``kubeletplugin/metrics.py``), so
the series appear on the same endpoint as ``flexnpu_dra_*``. Nothing here writes anything.

Series (gauges unless noted; ``node`` and ``driver`` on every one)::

    flexnpu_vnpu_pod_total_memory_bytes{namespace,pod,claim,die,vdie_id,v_dev_id}      the vNPU's memory quota
    flexnpu_vnpu_pod_used_memory_bytes{...}                                            memory allocated now
    flexnpu_vnpu_pod_compute_quota_percent{...}                                        its share of the die's compute
    flexnpu_vnpu_pod_compute_used_percent{...}                                         die share used since the daemon's last List
    flexnpu_vnpu_pod_compute_seconds_total{...}                             counter   die time its kernels ran
    flexnpu_vnpu_pod_kernels_total{...}                                     counter   kernels it launched
    flexnpu_vnpu_pod_queue_delay_seconds{...,priority}                      histogram its tasks' wait for the die
    flexnpu_vnpu_pod_queue_delay_bound_seconds{...,priority}                           the p99 bound of the alert
    flexnpu_vnpu_pod_slices_preempted_total{...,priority}                   counter   its slices a latency-critical
                                                                                      share went in ahead of
    flexnpu_die_priority_compute_seconds_total{die,vdie_id,priority}        counter   die time by priority (live shares)
    flexnpu_vnpu_pod_sessions{...}                                                     client sessions open on its aclserver
    flexnpu_aclserver_up{namespace,pod,claim}                                          1 Running, 0 otherwise
    flexnpu_aclserver_restarts_total{namespace,pod,claim}                   counter   restarts by the daemon
    flexnpu_die_shares{die,vdie_id} / flexnpu_die_share_limit{die,vdie_id}             aclservers on a die, and the cap
    flexnpu_die_memory_allocated_bytes{die,vdie_id} / flexnpu_die_memory_total_bytes   quotas summed, and the die
    flexnpu_die_compute_allocated_percent{die,vdie_id}                                 quotas summed (0..100)
    flexnpu_vnpu_collect_ok                                                            0 when the daemon did not answer

Conventions (mind-cluster's npu-exporter): the names follow mind-cluster's
``vnpu_pod_total_memory`` / ``vnpu_pod_used_memory`` and ``container_npu_*``, with a ``flexnpu_`` prefix and
Prometheus base units (bytes, not KB/MB); ``v_dev_id`` is mind-cluster's label for the vNPU's id (here the
virtual device number the container sees), ``vdie_id`` its stable die ID, ``die`` the physical ID used by the
rest of this driver, and ``pod`` (mind-cluster: ``pod_name``) the first pod in ``reservedFor`` ("" when none).
A value the daemon reports as unknown (-1) is left out rather than exported as -1.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from dra_driver.daemon_api.values import EntityInfo
from dra_driver.devices import Inventory
from dra_driver.errors import FlexNPUError

__all__ = [
    "DEFAULT_DELAY_BOUND_SECONDS",
    "POD_CACHE_SECONDS",
    "LedgerFigures",
    "VnpuUsageCollector",
    "pods_from_claim",
]

log = logging.getLogger("flexnpu.usage")

POD_CACHE_SECONDS = 60.0
DEFAULT_DELAY_BOUND_SECONDS = 0.002
"""The p99 queueing delay a latency-critical vNPU should stay under (``--latency-delay-bound-ms``)."""
DELAY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
"""The ledger's queueing-delay buckets (``flexnpu_runtime/aclserver/ledger.py`` DELAY_BUCKETS_S: a test checks)."""
MIB = 1024 * 1024

VNPU_LABELS = ("node", "driver", "namespace", "pod", "claim", "die", "vdie_id", "v_dev_id")
CLAIM_LABELS = ("node", "driver", "namespace", "pod", "claim")
DIE_LABELS = ("node", "driver", "die", "vdie_id")


class DaemonLister(Protocol):
    def list(self, *, probe: bool = False) -> list[EntityInfo]: ...


class ClaimReader(Protocol):
    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]: ...


class LedgerUse(Protocol):
    """What the collector reads of one ledger entry (``flexnpu_runtime.aclserver.ledger.LedgerEntry``)."""

    @property
    def claim_uid(self) -> str: ...
    @property
    def virtual_id(self) -> int: ...
    @property
    def consumed_us(self) -> int: ...
    @property
    def kernels(self) -> int: ...
    @property
    def priority(self) -> str: ...
    @property
    def preempted(self) -> int: ...
    @property
    def delay_sum_us(self) -> int: ...
    @property
    def delay_buckets(self) -> tuple[int, ...]: ...


@dataclass(frozen=True, slots=True)
class LedgerFigures:
    """What the ledger says of one vNPU."""

    consumed_us: int
    kernels: int
    priority: str = "normal"
    preempted: int = 0
    delay_sum_us: int = 0
    delay_buckets: tuple[int, ...] = ()


LedgerReader = Callable[[int], Sequence[LedgerUse]]
"""The live entries of one die's ledger, by physical die ID (raises OSError, ValueError or a driver error)."""


def pods_from_claim(claim: Mapping[str, Any]) -> tuple[str, ...]:
    """Names of the pods a claim is reserved for, in order (pure)."""
    reserved = (claim.get("status") or {}).get("reservedFor") or []
    return tuple(str(r.get("name", "")) for r in reserved if r.get("resource", "pods") == "pods")


@dataclass(frozen=True, slots=True)
class _PodsEntry:
    pods: tuple[str, ...]
    at: float


class VnpuUsageCollector:
    """A prometheus_client collector: ``registry.register(VnpuUsageCollector(...))``.

    **Parameters:**
    * daemon - the daemon client (``list()``); one call per scrape.
    * kube - reads claims for their pods (``get_claim``); a failure leaves ``pod`` empty.
    * inventory - returns the node's current dies (for die totals and VDie IDs).
    * node_name, driver_name - constant labels, as on ``flexnpu_dra_*``.
    * max_shares_per_die - the cap ``flexnpu_die_share_limit`` reports.
    * ledger - reads one die's ledger entries (kernel counts, die time); None: no ledger on this node.
    """

    def __init__(
        self,
        *,
        daemon: DaemonLister,
        kube: ClaimReader | None,
        inventory: Callable[[], Inventory],
        node_name: str,
        driver_name: str,
        max_shares_per_die: int,
        ledger: LedgerReader | None = None,
        clock: Callable[[], float] = time.monotonic,
        delay_bound_seconds: float = DEFAULT_DELAY_BOUND_SECONDS,
    ) -> None:
        self._ledger = ledger
        self._delay_bound = delay_bound_seconds
        self._daemon = daemon
        self._kube = kube
        self._inventory = inventory
        self._const = (node_name, driver_name)
        self._max_shares = max_shares_per_die
        self._clock = clock
        self._lock = threading.Lock()
        self._pods: dict[str, _PodsEntry] = {}

    def describe(self) -> Iterable[Metric]:
        return []  # no samples at registration time: collect() talks to the daemon

    def collect(self) -> Iterator[Metric]:
        try:
            entities = self._daemon.list(probe=True)  # sessions are counted only when probed
            ok = 1.0
        except FlexNPUError as err:
            log.debug("usage metrics: daemon list failed: %s", err)
            entities, ok = [], 0.0
        metrics = list(
            render(
                entities,
                pods=self._pods_of,
                compute=self._compute(entities),
                inventory=self._inventory(),
                const=self._const,
                max_shares=self._max_shares,
                collect_ok=ok,
                delay_bound=self._delay_bound,
            )
        )
        if ok:  # forget the pods of claims the daemon no longer serves
            live = {e.entity_id for e in entities}
            with self._lock:
                for uid in [u for u in self._pods if u not in live]:
                    del self._pods[uid]
        yield from metrics

    def _compute(self, entities: Sequence[EntityInfo]) -> dict[tuple[str, int], LedgerFigures]:
        """(claim UID, virtual ID) -> its ledger figures (die time, kernels, queueing delay), from the dies' ledgers."""
        out: dict[tuple[str, int], LedgerFigures] = {}
        if self._ledger is None:
            return out
        dies = sorted({u.share.die_phy_id for e in entities for u in e.shares})
        for die in dies:
            try:
                entries = self._ledger(die)
            except (FlexNPUError, OSError, ValueError) as exc:
                log.debug("usage metrics: ledger of die %d: %s", die, exc)
                continue
            for entry in entries:
                out[(entry.claim_uid, entry.virtual_id)] = LedgerFigures(
                    entry.consumed_us, entry.kernels, str(entry.priority), entry.preempted, entry.delay_sum_us,
                    tuple(entry.delay_buckets),
                )  # fmt: skip
        return out

    def _pods_of(self, ent: EntityInfo) -> tuple[str, ...]:
        now = self._clock()
        with self._lock:
            cached = self._pods.get(ent.entity_id)
            if cached is not None and now - cached.at < POD_CACHE_SECONDS and cached.pods:
                return cached.pods
        pods: tuple[str, ...] = cached.pods if cached else ()
        if self._kube is not None:
            try:
                claim = self._kube.get_claim(ent.namespace, ent.name)
                meta = claim.get("metadata") or {}
                if meta.get("uid") == ent.entity_id:
                    pods = pods_from_claim(claim)
            except FlexNPUError as err:
                log.debug("usage metrics: claim %s/%s: %s", ent.namespace, ent.name, err)
        with self._lock:
            self._pods[ent.entity_id] = _PodsEntry(pods, now)
        return pods


def render(
    entities: Sequence[EntityInfo],
    *,
    pods: Callable[[EntityInfo], tuple[str, ...]],
    compute: Mapping[tuple[str, int], LedgerFigures],
    inventory: Inventory,
    const: tuple[str, str],
    max_shares: int,
    collect_ok: float,
    delay_bound: float = DEFAULT_DELAY_BOUND_SECONDS,
) -> Iterator[Metric]:
    """The metric families for one scrape (pure apart from ``pods``)."""
    vdie = {d.phy_id: d.vdie_id for d in inventory.dies}
    families = {
        "total": GaugeMetricFamily(
            "flexnpu_vnpu_pod_total_memory_bytes", "Memory quota of the vNPU.", labels=VNPU_LABELS
        ),
        "used": GaugeMetricFamily(
            "flexnpu_vnpu_pod_used_memory_bytes",
            "Device memory the vNPU has allocated now.",
            labels=VNPU_LABELS,
        ),
        "cquota": GaugeMetricFamily(
            "flexnpu_vnpu_pod_compute_quota_percent",
            "The vNPU's share of its die's compute, in percent.",
            labels=VNPU_LABELS,
        ),
        "cused": GaugeMetricFamily(
            "flexnpu_vnpu_pod_compute_used_percent",
            "Compute of the die the vNPU used in the last scheduling window, in percent.",
            labels=VNPU_LABELS,
        ),
        "sessions": GaugeMetricFamily(
            "flexnpu_vnpu_pod_sessions",
            "Client sessions connected to the vNPU's aclserver.",
            labels=VNPU_LABELS,
        ),
    }
    seconds = CounterMetricFamily(
        "flexnpu_vnpu_pod_compute_seconds",
        "Die time the vNPU's kernels ran, in seconds (rate x 100 = percent of the die).",
        labels=VNPU_LABELS,
    )
    kernels = CounterMetricFamily(
        "flexnpu_vnpu_pod_kernels", "Kernels the vNPU launched.", labels=VNPU_LABELS
    )
    prio_labels = [*VNPU_LABELS, "priority"]
    delay = HistogramMetricFamily(
        "flexnpu_vnpu_pod_queue_delay_seconds",
        "How long the vNPU's tasks waited for the die (their first slice), in seconds.",
        labels=prio_labels,
    )
    bound = GaugeMetricFamily(
        "flexnpu_vnpu_pod_queue_delay_bound_seconds",
        "The p99 queueing delay a latency-critical vNPU should stay under (--latency-delay-bound-ms).",
        labels=prio_labels,
    )
    preempted = CounterMetricFamily(
        "flexnpu_vnpu_pod_slices_preempted",
        "Slices of the vNPU that a latency-critical share's slice went in ahead of (they ended later).",
        labels=prio_labels,
    )
    by_priority: dict[tuple[int, str], float] = {}
    up = GaugeMetricFamily(
        "flexnpu_aclserver_up", "1 while the claim's aclserver is Running.", labels=CLAIM_LABELS
    )
    restarts = CounterMetricFamily(
        "flexnpu_aclserver_restarts", "Times the daemon restarted the claim's aclserver.", labels=CLAIM_LABELS
    )
    shares_on: dict[int, set[str]] = {}  # one aclserver = one slot of --max-shares-per-die
    mem_on: dict[int, int] = {}
    compute_on: dict[int, int] = {}
    for ent in sorted(entities, key=lambda e: e.entity_id):
        pod_names = pods(ent)
        pod = pod_names[0] if pod_names else ""
        claim_labels = [*const, ent.namespace, pod, ent.name]
        up.add_metric(claim_labels, 1.0 if str(ent.state) == "Running" else 0.0)
        restarts.add_metric(claim_labels, float(ent.restarts))
        for usage in sorted(ent.shares, key=lambda u: u.share.virtual_id):
            s = usage.share
            labels = [*claim_labels, str(s.die_phy_id), vdie.get(s.die_phy_id, ""), str(s.virtual_id)]
            families["total"].add_metric(labels, float(s.memory_bytes))
            families["cquota"].add_metric(labels, float(s.compute_percent))
            if usage.memory_used_bytes >= 0:
                families["used"].add_metric(labels, float(usage.memory_used_bytes))
            if usage.compute_used_percent >= 0:
                families["cused"].add_metric(labels, float(usage.compute_used_percent))
            ledger_figures = compute.get((ent.entity_id, s.virtual_id))
            consumed_us = usage.compute_used_us
            if consumed_us < 0 and ledger_figures is not None:
                consumed_us = ledger_figures.consumed_us  # a daemon that does not report die time yet
            if consumed_us >= 0:
                seconds.add_metric(labels, consumed_us / 1e6)
            if ledger_figures is not None:
                kernels.add_metric(labels, float(ledger_figures.kernels))
                plabels = [*labels, ledger_figures.priority]
                if len(ledger_figures.delay_buckets) == len(DELAY_BUCKETS_S) + 1:
                    cumulative, running = [], 0
                    for le, n in zip(
                        [*map(str, DELAY_BUCKETS_S), "+Inf"], ledger_figures.delay_buckets, strict=True
                    ):
                        running += n
                        cumulative.append((le, float(running)))
                    delay.add_metric(plabels, cumulative, ledger_figures.delay_sum_us / 1e6)
                bound.add_metric(plabels, delay_bound)
                preempted.add_metric(plabels, float(ledger_figures.preempted))
                key = (s.die_phy_id, ledger_figures.priority)
                by_priority[key] = by_priority.get(key, 0.0) + ledger_figures.consumed_us / 1e6
            if usage.sessions >= 0:
                families["sessions"].add_metric(labels, float(usage.sessions))
            shares_on.setdefault(s.die_phy_id, set()).add(ent.entity_id)
            mem_on[s.die_phy_id] = mem_on.get(s.die_phy_id, 0) + s.memory_bytes
            compute_on[s.die_phy_id] = compute_on.get(s.die_phy_id, 0) + s.compute_percent
    yield from families.values()
    yield seconds
    yield kernels
    yield from (delay, bound, preempted)
    yield up
    yield restarts
    die_shares = GaugeMetricFamily(
        "flexnpu_die_shares",
        "Share claims (aclservers) served on the die, however many vNPUs each has.",
        labels=DIE_LABELS,
    )
    die_limit = GaugeMetricFamily(
        "flexnpu_die_share_limit",
        "Most share claims (aclservers) one die may serve (--max-shares-per-die).",
        labels=DIE_LABELS,
    )
    die_mem = GaugeMetricFamily(
        "flexnpu_die_memory_allocated_bytes", "Memory quotas of the die's shares, summed.", labels=DIE_LABELS
    )
    die_total = GaugeMetricFamily(
        "flexnpu_die_memory_total_bytes", "Device memory of the die.", labels=DIE_LABELS
    )
    die_compute = GaugeMetricFamily(
        "flexnpu_die_compute_allocated_percent",
        "Compute quotas of the die's shares, summed.",
        labels=DIE_LABELS,
    )
    die_priority = CounterMetricFamily(
        "flexnpu_die_priority_compute_seconds",
        "Die time the die's live vNPUs of each priority used, in seconds (a vNPU that leaves takes its time along).",
        labels=[*DIE_LABELS, "priority"],
    )
    for (phy, priority), seconds_used in sorted(by_priority.items()):
        die_priority.add_metric([*const, str(phy), vdie.get(phy, ""), priority], seconds_used)
    yield die_priority
    for die in sorted(inventory.dies, key=lambda d: d.phy_id):
        labels = [*const, str(die.phy_id), die.vdie_id]
        die_shares.add_metric(labels, float(len(shares_on.get(die.phy_id, ()))))
        die_limit.add_metric(labels, float(max_shares))
        die_mem.add_metric(labels, float(mem_on.get(die.phy_id, 0)))
        die_total.add_metric(labels, float(die.memory_mib * MIB))
        die_compute.add_metric(labels, float(compute_on.get(die.phy_id, 0)))
    yield from (die_shares, die_limit, die_mem, die_total, die_compute)
    ok = GaugeMetricFamily(
        "flexnpu_vnpu_collect_ok",
        "1 when the daemon answered this scrape's usage query.",
        labels=["node", "driver"],
    )
    ok.add_metric(list(const), collect_ok)
    yield ok
