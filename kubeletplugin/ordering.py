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
        self._last_pool: pools.Pool | None = None
        self._last_order: list[str] | None = None
        self._threads: list[threading.Thread] = []

    def order(self, pool: pools.Pool) -> pools.Pool:
        """``pool`` with each slice in policy order for what is allocated now (pure given the cache)."""
        self._last_pool = pool
        if not self.enabled:
            return pool
        results = self.allocations.results(pool.name)
        usage = placement.die_usage(results, placement.device_infos(pool))
        ordered = placement.order_pool(pool, usage, self.policy)
        names = ordered.device_names
        if self._last_order is not None and names != self._last_order:
            self.republishes += 1
        self._last_order = names
        return ordered

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
        for t in self._threads:
            t.join(timeout)

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
        usage = placement.die_usage(self.allocations.results(pool.name), placement.device_infos(pool))
        return placement.node_fill(placement.die_totals(pool), usage)


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
        yield from (in_use, partly, info, writes)
