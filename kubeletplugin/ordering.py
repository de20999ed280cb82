"""The node's die-level placement: its devices listed in policy order, republished on allocation.

Wiring of the pure order (``dra_driver/placement.py``) with the watch-fed allocation cache
(``controller/allocations.py``, this node's pool only) and the node's publisher:

* :meth:`DeviceOrdering.order` is the ordering policy the publisher applies to every pool it
  publishes (binpack or spread, from ``--placement``);
* the cache calls :meth:`DeviceOrdering.trigger` when an allocation on this pool appears,
  changes or goes; a loop then asks the publisher to republish, **coalesced**: at most
  ``--placement-writes-per-second`` republishes a second, each one for every change seen
  since the last; the publisher writes only when the desired pool differs from the published
  one (so a new allocation that leaves the order as it was writes nothing).

A burst of allocations faster than one republish is placed on the order of before the burst
(first-fit in that order): the known limit ``bench/bench_placement.py`` measures.
The series: ``flexnpu_placement_dies_in_use``, ``flexnpu_placement_dies_partly_used``
(fragmentation), ``flexnpu_placement_republishes_total`` and the ``policy`` info.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from controller.allocations import ClaimAllocations
from controller.kube import Kube
from dra_driver import liveness, placement
from dra_driver.placement import Placement
from dra_kubeletplugin.resourceslice import pools

log = logging.getLogger("flexnpu.placement")

LOOP_REORDER = "placement-republish"


class DeviceOrdering:
    """The ordering policy of one node and its coalesced republish loop.

    **Parameters:**
    * kube - the node's API client (the claim watch).
    * driver_name, pool_name - whose allocations count.
    * policy - binpack or spread.
    * writes_per_second - most republishes a second (0: the order is never changed by usage).
    * republish - the publisher's "publish what is desired now, if it differs" (it calls
      :meth:`order`, which counts the changes of order).
    """

    def __init__(
        self,
        kube: Kube,
        *,
        driver_name: str,
        pool_name: str,
        policy: Placement,
        writes_per_second: float,
        republish: Callable[[], object],
        live: liveness.Liveness | None = None,
    ) -> None:
        self.policy = policy
        self.pool_name = pool_name
        self.min_interval = 1.0 / writes_per_second if writes_per_second > 0 else 0.0
        self.enabled = writes_per_second > 0
        self.republish = republish
        self.live = live or liveness.Liveness()
        self.allocations = ClaimAllocations(
            kube, driver=driver_name, pool=pool_name, on_change=self._changed, live=self.live
        )
        self._wake = threading.Event()
        self.republishes = 0
        """How often the order changed (each change is published once)."""
        self.unchanged = 0
        """Changes of the allocations that left the order as it was (nothing written)."""
        self.equivalent = 0
        """Policy orders that differed from the one given last but were first-fit equivalent to it
        (the same fit devices in the same order in each slice): the one given last was kept."""
        self._last_pool: pools.Pool | None = None
        self._given: tuple[pools.Pool, pools.Pool] | None = None  # (pool asked for, order given)
        self._facts: tuple[pools.Pool, placement.PoolFacts] | None = None
        self._threads: list[threading.Thread] = []

    def order(self, pool: pools.Pool) -> pools.Pool:
        """``pool`` with each slice in policy order for what is allocated now (pure given the cache).

        When the policy order differs from the order given last for the same pool only in where
        it puts devices that no claim can get now (``placement.unfit_devices``: held, full, kept off
        by their die's counters), the order given last is kept: the allocator skips those devices,
        so both orders make it pick the same devices, and keeping it writes nothing. (Binpack
        filling dies one after another never needs a write; spread does on each allocation.)
        """
        self._last_pool = pool
        if not self.enabled:
            return pool
        facts = self._facts_of(pool)
        results = self.allocations.results(pool.name)
        usage = placement.die_usage(results, facts.infos)
        ordered = placement.order_pool(pool, usage, self.policy, facts)
        given = self._given
        if given is not None and given[0] == pool and given[1] != ordered:
            unfit = placement.unfit_devices(facts, results)
            if placement.first_fit_view(ordered, unfit) == placement.first_fit_view(given[1], unfit):
                self.equivalent += 1
                ordered = given[1]
        if given is not None and ordered.device_names != given[1].device_names:
            self.republishes += 1
        self._given = (pool, ordered)
        return ordered

    def _facts_of(self, pool: pools.Pool) -> placement.PoolFacts:
        """The pool's facts, worked out again only when the pool differs from the last one's."""
        cached = self._facts
        if cached is None or not (cached[0] is pool or cached[0] == pool):
            cached = self._facts = (pool, placement.PoolFacts.of(pool))
        return cached[1]

    def trigger(self) -> None:
        self._wake.set()

    def _changed(self, changed: frozenset[str]) -> None:
        if self.pool_name in changed:
            self.trigger()

    def start(self, stop: threading.Event) -> None:
        """The claim watch and the republish loop, in daemon threads, until ``stop``."""
        if not self.enabled:
            return
        self.live.register(LOOP_REORDER, deadline=3600)
        for name, target in (
            ("allocation-watch", lambda: self.allocations.run(stop)),
            (
                LOOP_REORDER,
                lambda: liveness.run_forever(
                    self.live, LOOP_REORDER, lambda: self._once(stop), stop, logger=log
                ),
            ),
        ):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def join(self, timeout: float = 5.0) -> None:
        """Wait for the ordering's threads, ``timeout`` seconds for all of them together."""
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _once(self, stop: threading.Event) -> float | None:
        """Wait for a change, republish once for everything seen, then hold off ``min_interval``."""
        if not self._wake.wait(timeout=600):
            return None
        if stop.is_set():
            return None
        self._wake.clear()
        started = time.monotonic()
        before = self.republishes
        self.republish()
        if self.republishes == before:
            self.unchanged += 1
        rest = self.min_interval - (time.monotonic() - started)
        return rest if rest > 0 else None

    def fill(self) -> placement.NodeFill:
        pool = self._last_pool
        if pool is None:
            return placement.NodeFill()
        facts = self._facts_of(pool)
        usage = placement.die_usage(self.allocations.results(pool.name), facts.infos)
        return placement.node_fill(facts.totals, usage)


class PlacementCollector:
    """A prometheus_client collector of this node's placement series (labels node, driver)."""

    def __init__(self, ordering: DeviceOrdering, *, node_name: str, driver_name: str) -> None:
        self._ordering = ordering
        self._labels = [node_name, driver_name]

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        names = ["node", "driver"]
        fill = self._ordering.fill()
        in_use = GaugeMetricFamily("flexnpu_placement_dies_in_use", "dies with any allocation", labels=names)
        in_use.add_metric(self._labels, fill.dies_in_use)
        partly = GaugeMetricFamily(
            "flexnpu_placement_dies_partly_used",
            "dies partly used (fragmentation: neither free nor full)",
            labels=names,
        )
        partly.add_metric(self._labels, fill.dies_partly_used)
        info = GaugeMetricFamily(
            "flexnpu_placement_policy", "the die-level placement policy (1)", labels=[*names, "policy"]
        )
        info.add_metric([*self._labels, str(self._ordering.policy)], 1)
        writes = CounterMetricFamily(
            "flexnpu_placement_republishes", "republishes for a changed device order", labels=names
        )
        writes.add_metric(self._labels, self._ordering.republishes)
        kept = CounterMetricFamily(
            "flexnpu_placement_orders_kept",
            "changed policy orders not published: first-fit equivalent to the published one",
            labels=names,
        )
        kept.add_metric(self._labels, self._ordering.equivalent)
        yield from (in_use, partly, info, writes, kept)
