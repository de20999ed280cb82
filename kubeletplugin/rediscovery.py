"""Rediscovery: the node's dies discovered again every ``--rediscover-seconds``, and a changed inventory served as one.

On a change (health, dies added or gone, modes) the node is first made able to serve the new
inventory (the emulated device nodes of new dies, the vNPU manager when a die now offers
templates: ``kubeletplugin/vnpus.py``), then each die is published once every part that serves it
can (what that means, pure: ``dra_driver/rediscovery.py``; a die handed out as shares waits for
``flexnpu-daemon`` to know it), then the health stream is told. Without a change, a republish is
requested anyway: the capacity held by vNPUs made outside the driver may have changed.
A failed discovery keeps the last inventory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dra_driver import discovery
from dra_driver import rediscovery as changes
from dra_driver.config import Config
from dra_driver.daemon_api.client import DaemonClient
from dra_driver.devices import Inventory
from dra_driver.errors import FlexNPUError
from kubeletplugin.health import InventoryHealth
from kubeletplugin.publisher import Publisher
from kubeletplugin.served import ServedDies
from kubeletplugin.vnpus import NodeVnpus

__all__ = ["Rediscovery"]

log = logging.getLogger("flexnpu.node")


class Rediscovery:
    """One :meth:`iteration` per ``--rediscover-seconds`` (the first only waits: start just discovered)."""

    def __init__(
        self,
        cfg: Config,
        *,
        served: ServedDies,
        vnpus: NodeVnpus,
        publisher: Publisher,
        health: InventoryHealth,
        notify_health: Callable[[], None],
        daemon: DaemonClient | None,
    ) -> None:
        self.cfg = cfg
        self.served = served
        self.vnpus = vnpus
        self.publisher = publisher
        self.health = health
        self.notify_health = notify_health
        self.daemon = daemon
        self.source = discovery.from_config(inventory=cfg.inventory, npu_smi=cfg.npu_smi)
        self._first = True

    def iteration(self) -> float:
        if self._first:  # the inventory was just discovered at start
            self._first = False
            return self.cfg.rediscover_seconds
        try:
            self.once()
        except FlexNPUError as err:
            log.warning("rediscovery failed, keeping the last inventory: %s", err)
        return self.cfg.rediscover_seconds

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
        self.health.inventory = fresh
        self.publisher.publish()
        self.health.published = set(self.publisher.pool.device_names)
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
