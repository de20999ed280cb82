"""Publishing this node's ResourceSlices: what the node offers now, told to the helper, one publish at a time.

:class:`Publisher` builds the desired pool (``dra_driver/slices.py``) from the dies served now
(``kubeletplugin/served.py``, without the withheld ones), each die's mode, the capacity held by vNPUs
made outside the driver, and the share policy each die's prepared shares run; the helper
(``dra_kubeletplugin``) writes the difference to the API server.

**Inputs, all given at construction** (nothing is patched in later):

* ``events`` — the node's :class:`~kubeletplugin.events.NodeEvents`; the publisher subscribes to
  ``claims_changed`` in its constructor (after each kubelet call, a reconciler removal, an
  aclserver-watch look) and republishes when a die's share policy changed (its first share
  prepared, its last gone).
* ``ordering`` — a :class:`PoolOrdering`: the order of the devices in the published pool. The
  scheduler's allocator takes the first device that fits, so the order is a placement policy
  (binpack, spread). Default :data:`AS_BUILT` (the order ``slices.build_pool`` makes). An ordering
  that depends on the API's allocations emits ``order_changed`` from its watch thread when they
  change; the publisher subscribes :meth:`Publisher.request_republish` to it in its constructor.

**Triggers:** :meth:`Publisher.publish` (at start and after an inventory change: always sent) and
:meth:`Publisher.request_republish` (from any thread: recompute, send only when the pool changed;
coalesced: a request made while another thread publishes returns at once, and that thread
publishes once more for it). :meth:`Publisher.counters_dropped` is the helper's
``on_dropped_fields`` (the API server dropped the counter fields: one mode per die from then on).

**Locking:** one lock held for each build-and-send, so two threads never publish out of order; a
second small lock guards the "publish again" flag. Until :meth:`Publisher.start` gives it the helper,
the publisher only computes the pool (the health stream needs its device names before serving).
A pool the API server would refuse is logged and not published (what was published stays).
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from dra_driver import records, slices
from dra_driver.checkpoint import CheckpointStore
from dra_driver.sharing import Policy
from dra_driver.vnpu import Vnpu, sweeping
from dra_kubeletplugin.errors import DroppedFieldsError, PluginError
from dra_kubeletplugin.resourceslice.pools import DriverResources
from kubeletplugin.events import NodeEvents
from kubeletplugin.served import ServedDies
from kubeletplugin.vnpus import NodeVnpus

__all__ = ["AS_BUILT", "PoolOrdering", "Publisher", "SliceSink"]

log = logging.getLogger("flexnpu.node")


class PoolOrdering(Protocol):
    """The order of the devices this node publishes (a placement policy)."""

    def order(self, pool: slices.DesiredPool) -> slices.DesiredPool:
        """``pool`` with its devices in the order to publish; the same devices, each in a valid slice."""
        ...


class _AsBuilt:
    def order(self, pool: slices.DesiredPool) -> slices.DesiredPool:
        return pool


AS_BUILT: PoolOrdering = _AsBuilt()
"""The order ``slices.build_pool`` makes: whole dies ascending, then shares, then templates."""


class SliceSink(Protocol):
    """Where the pool goes: the helper (``dra_kubeletplugin.Helper``)."""

    def publish_resources(self, resources: DriverResources) -> None: ...


class Publisher:
    """This node's pool: computed on each trigger, sent to the helper when it changed (see the module docstring)."""

    def __init__(
        self,
        *,
        served: ServedDies,
        store: CheckpointStore,
        vnpus: NodeVnpus,
        driver_name: str,
        node_name: str,
        max_shares_per_die: int,
        events: NodeEvents,
        ordering: PoolOrdering = AS_BUILT,
    ) -> None:
        self.served = served
        self.store = store
        self.vnpus = vnpus
        self.driver_name = driver_name
        self.node_name = node_name
        self.max_shares_per_die = max_shares_per_die
        self.ordering = ordering
        self.use_counters = True
        self._lock = threading.Lock()  # one build-and-send at a time
        self._flag = threading.Lock()  # guards _again and _force
        self._again = False
        self._force = False
        self._sink: SliceSink | None = None
        self._foreign: tuple[Vnpu, ...] = ()
        self._policies = self._share_policies()
        self.pool = self._desired(self._policies)
        """The pool as last computed (and sent, once started)."""
        events.claims_changed.subscribe(self.claims_changed)
        events.order_changed.subscribe(self.request_republish)

    # -- triggers ----------------------------------------------------------------------------

    def start(self, sink: SliceSink) -> None:
        """Publish to ``sink`` from now on, starting with the pool as it is now."""
        self._sink = sink
        self.publish()

    def publish(self) -> None:
        """Recompute and send, even if unchanged; waits for a publish in flight."""
        self._request(force=True, wait=True)

    def request_republish(self) -> None:
        """Recompute and send if the pool changed; from any thread; coalesced (see the module docstring)."""
        self._request(force=False, wait=False)

    def claims_changed(self) -> None:
        """A ``claims_changed`` event: republish when a die's share policy changed."""
        if self._share_policies() != self._policies:
            self.request_republish()

    def counters_dropped(self, err: DroppedFieldsError) -> None:
        """The API server dropped the counter fields (DRAPartitionableDevices off): one mode per die."""
        if self.use_counters:
            log.warning("%s; publishing each die in one mode only (no whole+share on one die)", err)
            self.use_counters = False
            self.publish()

    # -- one publish ---------------------------------------------------------------------------

    def _request(self, *, force: bool, wait: bool) -> None:
        with self._flag:
            self._again = True
            self._force = self._force or force
        while True:
            if not self._lock.acquire(blocking=wait):
                return  # the thread publishing now publishes again for this request
            try:
                while True:
                    with self._flag:
                        if not self._again:
                            break
                        force, self._again, self._force = self._force, False, False
                    self._publish_once(force=force)
            finally:
                self._lock.release()
            with self._flag:
                if not self._again:  # a request that came between the last check and the release
                    return
            wait = False

    def _publish_once(self, *, force: bool) -> None:
        policies = self._share_policies()
        pool = self._desired(policies)
        changed = pool != self.pool
        self.pool, self._policies = pool, policies
        if self._sink is None or not (changed or force):
            return
        try:
            self._sink.publish_resources(DriverResources.single(pool))
        except PluginError as err:
            log.error("not publishing this node's pool: %s", err)

    def _desired(self, policies: dict[int, Policy]) -> slices.DesiredPool:
        published = self.served.published()
        pool = slices.build_pool(
            published,
            driver_name=self.driver_name,
            node_name=self.node_name,
            mode_of=lambda die: self.served.mode_of(die, published),
            use_counters=self.use_counters,
            max_shares_per_die=self.max_shares_per_die,
            held=self._held(),
            policies=policies,
        )
        return self.ordering.order(pool)

    def _share_policies(self) -> dict[int, Policy]:
        """The policy each die's prepared shares run: its other share devices are not offered."""
        return {phy: Policy(p) for phy, p in records.share_policies(self.store.entries().values()).items()}

    def _held(self) -> dict[int, slices.Held]:
        """Capacity held by vNPUs made outside the driver: published without it, and reported."""
        if not self.vnpus.on:
            return {}
        foreign = sweeping.foreign_vnpus(self.vnpus, self.vnpus.state_dir)
        if foreign is None:  # cannot list now: keep what was held before
            foreign = self._foreign
        if foreign != self._foreign:
            for v in foreign:
                log.warning(
                    "vNPU %d (%s) on die %d was not made by this driver: its capacity is not offered",
                    v.vnpu_id,
                    v.template,
                    v.phy_id,
                )
            self._foreign = foreign
        return sweeping.held_capacity(foreign, self.served.inventory)
