"""The node's own series on its telemetry endpoint: die-level placement and per-vNPU usage.

:func:`add_collectors` installs, into the node's :class:`~dra_driver.telemetry.Telemetry`, the
placement collector (``kubeletplugin/ordering.py``: dies in use, fragmentation, republishes) and,
when the node talks to ``flexnpu-daemon``, the per-vNPU usage collector
(``dra_driver/usage_metrics.py``) with the reader of the per-die ledgers the aclservers write under
``<shm dir>/.ledger``. That reader (``flexnpu_runtime/aclserver/ledger.py``) makes this the one node
module that imports the host runtime (``tests/unit/test_import_graph.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from controller.kube import Kube
from dra_driver import usage_metrics
from dra_driver.config import Config
from dra_driver.daemon_api.client import DaemonClient
from dra_driver.daemon_api.values import LEDGER_DIR_NAME
from dra_driver.devices import Inventory
from dra_driver.telemetry import Telemetry
from flexnpu_runtime.aclserver import ledger
from kubeletplugin import ordering

__all__ = ["add_collectors"]


def add_collectors(
    telemetry: Telemetry,
    cfg: Config,
    *,
    placement: ordering.DeviceOrdering,
    kube: Kube,
    inventory: Callable[[], Inventory],
) -> None:
    """Serve the placement series, and the per-vNPU usage series when ``--daemon-socket`` is set."""
    telemetry.add_collector(
        ordering.PlacementCollector(placement, node_name=cfg.node_name, driver_name=cfg.driver_name)
    )
    if cfg.daemon_socket is None:
        return
    telemetry.add_collector(
        usage_metrics.VnpuUsageCollector(
            daemon=DaemonClient(cfg.daemon_socket, timeout=3.0),
            kube=kube,
            inventory=inventory,
            node_name=cfg.node_name,
            driver_name=cfg.driver_name,
            max_shares_per_die=cfg.max_shares_per_die,
            ledger=functools.partial(ledger.read_entries, str(cfg.paths.shm_root / LEDGER_DIR_NAME)),
            delay_bound_seconds=cfg.latency_delay_bound_seconds,
        )
    )
