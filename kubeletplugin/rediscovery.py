"""Rediscovery: the node's dies discovered again every ``--rediscover-seconds``, and a changed inventory served as one.

On a change (health, dies added or gone, modes) the node is first made able to serve the new
inventory (the emulated device nodes of new dies, the vNPU manager when a die now offers
templates: ``kubeletplugin/vnpus.py``), then each die is published once every part that serves it
can (what that means, pure: ``dra_driver/rediscovery.py``; a die handed out as shares waits for
``flexnpu-daemon`` to know it), then the health stream is told (``kubeletplugin/health.py`` reads
the served inventory and the published pool itself). Without a change, a republish is requested
anyway: the capacity held by vNPUs made outside the driver may have changed. A failed discovery
keeps the last inventory.

The first publication obeys the same rule (issue 25, class 12): a rolling update's new plugin pod
may read a newer inventory than the daemon's (the kubelet updates each pod's ConfigMap volume on
its own schedule), so :meth:`Rediscovery.hold_back_unserved` withholds, before the first publish,
the dies handed out as shares that the daemon says it does not serve (but none a prepared claim of
the checkpoint holds), and the loop runs (every :data:`WITHHELD_RETRY_SECONDS` when rediscovery
is off) until they are served.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dra_driver import discovery
from dra_driver import rediscovery as changes
from dra_driver.checkpoint import CheckpointStore
from dra_driver.config import Config
from dra_driver.daemon_api.client import DaemonClient
from dra_driver.devices import Inventory
from dra_driver.errors import FlexNPUError
from kubeletplugin.publisher import Publisher
from kubeletplugin.served import ServedDies
from kubeletplugin.vnpus import NodeVnpus

__all__ = ["WITHHELD_RETRY_SECONDS", "Rediscovery"]

log = logging.getLogger("flexnpu.node")

WITHHELD_RETRY_SECONDS = 5.0
"""With rediscovery off (``--rediscover-seconds 0``), how often dies withheld at start are looked at again."""


class Rediscovery:
    """One :meth:`iteration` per ``--rediscover-seconds`` (the first only waits: start just discovered)."""

    def __init__(
        self,
        cfg: Config,
        *,
        served: ServedDies,
        vnpus: NodeVnpus,
        publisher: Publisher,
        store: CheckpointStore,
        notify_health: Callable[[], None],
        daemon: DaemonClient | None,
    ) -> None:
        self.cfg = cfg
        self.served = served
        self.vnpus = vnpus
        self.publisher = publisher
        self.store = store
        self.notify_health = notify_health
        self.daemon = daemon
        self.source = discovery.from_config(inventory=cfg.inventory, npu_smi=cfg.npu_smi)
        self._first = True

    @property
    def period(self) -> float:
        """``--rediscover-seconds``; with it off, how often withheld dies are looked at again."""
        return self.cfg.rediscover_seconds if self.cfg.rediscover_seconds > 0 else WITHHELD_RETRY_SECONDS

    @property
    def needed(self) -> bool:
        """Whether the loop must run: rediscovery is on, or dies wait for the daemon."""
        return self.cfg.rediscover_seconds > 0 or bool(self.served.withheld)

    def iteration(self) -> float:
        if self._first:  # the inventory was just discovered at start
            self._first = False
            return self.period
        if self.cfg.rediscover_seconds <= 0 and not self.served.withheld:
            return self.period  # rediscovery off, and every discovered die published
        try:
            self.once()
        except FlexNPUError as err:
            log.warning("rediscovery failed, keeping the last inventory: %s", err)
        return self.period

    def hold_back_unserved(self) -> frozenset[int]:
        """Before the first publish: withhold the dies handed out as shares that flexnpu-daemon says
        it does not serve (the withheld dies). The dies the checkpoint's claims hold were served
        before, so they stay published (nothing alive is withdrawn on doubt). Nothing is withheld
        when the daemon cannot be asked (none configured, or not up yet): the node publishes as it
        always did, and prepare retries the daemon."""
        daemon_dies = self._daemon_dies()
        if daemon_dies is None:
            return frozenset()
        held = {d.phy for e in self.store.entries().values() for d in e.dies}
        inventory = self.served.inventory
        withheld = changes.withheld(
            inventory, self.served.mode_of, daemon_dies=daemon_dies, served_shared=held
        )
        if withheld:
            log.warning(
                "die(s) %s not published yet: flexnpu-daemon does not serve them yet (asked again every %g s)",
                sorted(withheld),
                self.period,
            )
            self.served.replace(inventory, withheld)
        return withheld

    def once(self) -> None:
        """Discover once; serve and publish what changed."""
        served, mode_of = self.served, self.served.mode_of
        fresh = self.source.discover()
        if fresh == served.inventory and not served.withheld:
            self.publisher.request_republish()  # capacity held by vNPUs made outside the driver may have changed
            return
        change = changes.describe(served.inventory, fresh, mode_of)
        if change:
            log.warning("inventory changed: %s", change.text())
            self._serve(fresh)
        served_shared = {
            d.phy_id
            for d in served.inventory.dies
            if d.phy_id not in served.withheld and changes.needs_daemon(mode_of(d, served.inventory))
        }
        withheld = changes.withheld(
            fresh, mode_of, daemon_dies=self._daemon_dies(), served_shared=served_shared
        )
        if withheld:
            log.warning(
                "die(s) %s not published yet: flexnpu-daemon does not serve them yet (it discovers again every"
                " --rediscover-seconds)",
                sorted(withheld),
            )
        elif served.withheld:
            log.info("die(s) %s now served by flexnpu-daemon: publishing them", sorted(served.withheld))
        if fresh == served.inventory and withheld == served.withheld:
            return
        served.replace(fresh, withheld)
        self.publisher.publish()
        self.notify_health()

    def _serve(self, fresh: Inventory) -> None:
        """Before a changed inventory is published: the emulated device nodes of new dies, and a vNPU
        manager that knows them when any die now offers templates."""
        if self.cfg.build_device_root:
            from dra_driver import devroot

            devroot.build_for_config(self.cfg)
        if self.served.offers_templates(fresh):
            self.vnpus.serve(fresh)

    def _daemon_dies(self) -> frozenset[int] | None:
        """The dies flexnpu-daemon serves now; None when it cannot say (unreachable, or too old)."""
        if self.daemon is None:
            return None
        try:
            health = self.daemon.health()
        except FlexNPUError as err:
            log.info("rediscovery: cannot ask flexnpu-daemon which dies it serves: %s", err)
            return None
        if not health.die_ids and health.dies:
            return None
        return frozenset(health.die_ids)
