"""The node process: kubelet plugin plus controllers, wired from one :class:`Config`. Wiring only.

Start order: discover dies → open the checkpoint (a corrupt one is kept aside, never fatal)
→ serve DRA on the plugin socket, then registration → load the Kubernetes client (the costliest
import, so it comes after the kubelet can register us; bench/bench_startup.py) → publish ResourceSlices
(``publisher.py``, its devices in placement order: ``ordering.py``) and run the loops in threads
(``liveness.Loops``): the reconciler, the aclserver watch (``healing.py``), readiness (``readiness.py``),
rediscovery (``rediscovery.py``). The metrics: ``metrics.py``.
SIGTERM/SIGINT: stop publishing, stop serving, remove both sockets, leave the node if this was
the last instance (``leaving.py``). Running aclservers and prepared claims are not touched, so a
restart or rolling update is seamless.
"""

from __future__ import annotations

import logging

import dra_kubeletplugin
from controller.kube import Kube
from dra_driver import liveness, logs, netlink, readiness
from dra_driver.config import Config
from dra_driver.errors import FlexNPUError
from dra_kubeletplugin.helper import PublishOptions
from kubeletplugin import error_status, healing, metrics, ordering
from kubeletplugin.core import NodeCore
from kubeletplugin.driver import NpuDriver
from kubeletplugin.health import InventoryHealth
from kubeletplugin.leaving import Leaving
from kubeletplugin.publisher import Publisher
from kubeletplugin.readiness import READINESS_PERIOD, ReadinessWriter
from kubeletplugin.rediscovery import Rediscovery

log = logging.getLogger("flexnpu.node")

LOOP_ACLSERVERS, LOOP_REDISCOVER, LOOP_READINESS = "aclserver-monitor", "rediscover", "readiness"
PUBLISH_DEBOUNCE = 0.1
"""Seconds from a publish (or a watch event of the node's slices) to the helper's sync: a placement
reorder reaches the scheduler before the next pod (the helper's default 0.5 s would let it land on the
old order)."""


class NodeProcess(NodeCore):
    """Everything the node process runs; ``start()`` then ``wait()``; ``stop()`` from any thread."""

    def __init__(self, cfg: Config, *, kube: Kube | None = None) -> None:
        super().__init__(cfg, kube=kube, serve_metrics=True)
        self.loops = liveness.Loops(self.live, logger=log)
        # Die-level placement (docs/placement.md): the devices in policy order from the allocations
        # the claim watch sees, a coalesced republish (``order_changed``) when the order changes.
        self.ordering = ordering.DeviceOrdering(
            self.kube,
            driver_name=cfg.driver_name,
            pool_name=cfg.pool_name,
            policy=cfg.placement,
            writes_per_second=cfg.placement_writes_per_second,
            republish=self.events.order_changed.emit,
            live=self.live,
        )
        self.publisher = Publisher(
            served=self.served,
            store=self.store,
            vnpus=self.vnpus,
            driver_name=cfg.driver_name,
            node_name=cfg.node_name,
            max_shares_per_die=cfg.max_shares_per_die,
            events=self.events,
            ordering=self.ordering,
        )
        self.health = InventoryHealth(
            lambda: self.served.inventory, cfg.pool_name, lambda: self.publisher.pool.device_names
        )
        self.driver = NpuDriver(self.preparer, telemetry=self.telemetry)
        self.telemetry.serve_health(self.live.healthz, self.live.ages)
        metrics.add_collectors(  # placement, and per-vNPU usage with a daemon
            self.telemetry,
            cfg,
            placement=self.ordering,
            kube=self.kube,
            inventory=lambda: self.served.inventory,
        )
        self.aclservers = (
            None
            if self.daemon is None
            else healing.AclserverPass(
                preparer=self.preparer,
                daemon=self.daemon,
                store=self.store,
                events=self.events,
                get_claim=self.kube.get_claim,
                create_event=self.kube.create_event,
                node_name=cfg.node_name,
            )
        )

    def start(self) -> None:
        cfg = self.cfg
        cfg.paths.cdi_dir.mkdir(parents=True, exist_ok=True)
        if cfg.control_link:
            netlink.ensure_link(self.link)  # a clear error at start, never a hang
        self.telemetry.start()
        self.check_boot()
        self.helper = dra_kubeletplugin.start(
            self.driver,
            driver_name=cfg.driver_name,
            node_name=cfg.node_name,
            kube=self.kube.for_helper(),  # the helper sees its own errors on the same connection
            pod_uid=cfg.pod_uid,
            registry_dir=cfg.paths.kubelet_registry_dir,
            plugins_dir=cfg.paths.kubelet_plugins_dir,
            health_source=self.health,
            error_status=error_status.status_for,
            publish=PublishOptions(
                resync_seconds=cfg.slice_resync_seconds, debounce_seconds=PUBLISH_DEBOUNCE
            ),
            on_dropped_fields=self.publisher.counters_dropped,
            live=self.live,
            log=logs.claim_logger("-", base=logging.getLogger("flexnpu.publisher")),
        )
        try:
            self.kube.connect()  # the kubernetes client loads while the kubelet registers the plugin
        except FlexNPUError:
            self.helper.stop(grace=0)
            raise
        rediscovery = Rediscovery(
            cfg,
            served=self.served,
            vnpus=self.vnpus,
            publisher=self.publisher,
            store=self.store,
            notify_health=self.helper.notify_health_changed,
            daemon=self.daemon,
        )
        rediscovery.hold_back_unserved()  # the first publish too: only what every part serves
        self.publisher.start(self.helper)
        self.ordering.start(self.loops.stop)
        self.loops.thread("reconciler", self.reconciler.run, self.loops.stop)
        if self.aclservers is not None:
            deadline = healing.ACLSERVER_PERIOD * 5 + 60
            self.loops.loop(LOOP_ACLSERVERS, self.aclservers.iteration, deadline=deadline)
        self.readiness = ReadinessWriter(readiness.path_for(cfg.paths.run_dir, cfg.pod_uid), self.helper)
        self.loops.loop(LOOP_READINESS, self.readiness.iteration, deadline=READINESS_PERIOD * 10 + 60)
        if rediscovery.needed:
            self.loops.loop(LOOP_REDISCOVER, rediscovery.iteration, deadline=rediscovery.period * 2 + 120)
        self.leaving = Leaving(
            self.helper, control_link=cfg.control_link, store=self.store, daemon=self.daemon
        )
        log.info(
            "node %s ready: %d dies, DRA socket %s, registration socket %s",
            cfg.node_name,
            len(self.served.inventory.dies),
            cfg.dra_socket,
            cfg.registration_socket,
        )

    def stop(self) -> None:
        self.loops.stop.set()
        self.reconciler.trigger()
        self.ordering.trigger()  # its loop waits for a change: wake it to see the stop

    def wait(self) -> None:
        while not self.loops.stop.wait(0.2):
            pass  # short steps: the kernel may give SIGTERM to another thread, and Python runs its
            # handler only when the main thread runs again (a wait without a timeout never would)
        self.helper.stop(grace=5.0)
        self.loops.join(timeout=10)
        self.ordering.join()
        self.leaving.leave()
        self.close()
        self.telemetry.shutdown()
        self.readiness.remove()
        log.info("node process stopped; sockets removed")


def run(cfg: Config) -> int:
    logs.setup(cfg.log_level, json_format=cfg.log_json)
    try:
        node = NodeProcess(cfg)
    except FlexNPUError as err:
        log.error("cannot start: %s", err)
        return 2

    def on_signal(signum: int) -> None:
        log.info("signal %d: shutting down", signum)
        node.stop()

    liveness.handle_signals(on_signal)
    try:
        node.start()
    except FlexNPUError as err:
        log.error("cannot start: %s", err)
        return 2
    node.wait()
    return 0
