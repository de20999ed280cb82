"""Device health for the kubelet's health stream (dra-example-driver's ``health.go``): from the discovered inventory.

The helper (``dra_kubeletplugin/health_stream.py``) streams it; this module only says, per published
device, whether its die is healthy. It reads both when asked: the inventory served now
(``kubeletplugin/served.py``) and the devices of the pool as last published (``kubeletplugin/publisher.py``),
so nobody updates it; rediscovery calls ``notify_health_changed`` on the helper when the inventory changed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from dra_driver.devices import Health, Inventory
from dra_kubeletplugin.claims import DeviceHealthReport

__all__ = ["InventoryHealth"]


class InventoryHealth:
    """Device health for the kubelet's health stream, from the discovered inventory."""

    def __init__(
        self, inventory: Callable[[], Inventory], pool: str, published: Callable[[], Collection[str]]
    ) -> None:
        self.inventory = inventory
        self.pool = pool
        self.published = published

    def device_health(self) -> list[DeviceHealthReport]:
        out: list[DeviceHealthReport] = []
        published = set(self.published())
        for die in self.inventory().dies:
            healthy = {Health.HEALTHY: True, Health.UNHEALTHY: False}.get(die.health)
            for name in (die.whole_device_name, *die.share_device_names):
                if name in published:
                    out.append(DeviceHealthReport(self.pool, name, healthy, f"die {die.phy_id} {die.health}"))
        return out
