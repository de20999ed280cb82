"""The node process: kubelet plugin plus controllers, wired from one :class:`Config`. Wiring only.

Start order: discover dies → open the checkpoint (a corrupt one is kept aside, never fatal)
→ serve DRA on the plugin socket, then registration → load the Kubernetes client (the costliest
import, so it comes after the kubelet can register us; bench/bench_startup.py) → publish
ResourceSlices (``publisher.py``, its devices in placement order: ``ordering.py``) and run the loops in threads: the reconciler, the aclserver
watch (``healing.py``), readiness (``readiness.py``), rediscovery (``rediscovery.py``).
SIGTERM/SIGINT: stop publishing, stop serving, remove both sockets, leave the node if this was
the last instance (``leaving.py``). Running aclservers and prepared claims are not touched, so a
restart or rolling update is seamless.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

import dra_kubeletplugin
from controller.kube import Kube
from dra_driver import liveness, logs, netlink, readiness, usage_metrics
from dra_driver.config import Config
from dra_driver.daemon_api.client import DaemonClient
from dra_driver.daemon_api.values import LEDGER_DIR_NAME
from dra_driver.errors import FlexNPUError
from dra_driver.telemetry import Telemetry
from dra_kubeletplugin.helper import PublishOptions
from flexnpu_runtime.aclserver import ledger
from kubeletplugin import error_status, healing, ordering
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
        wait_for_port = cfg.pod_uid is not None  # a rolling update's old pod may still hold the port
        telemetry = Telemetry(
            node_name=cfg.node_name,
            driver_name=cfg.driver_name,
            metrics_port=cfg.metrics_port,
            wait_for_port=wait_for_port,
        )
        super().__init__(cfg, kube=kube, telemetry=telemetry)
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        # Die-level placement (docs/placement.md): the devices in policy order from the allocations
        # the claim watch sees, a coalesced republish when the order changes.
        self.ordering = ordering.DeviceOrdering(
            self.kube,
            driver_name=cfg.driver_name,
            pool_name=cfg.pool_name,
            policy=cfg.placement,
            writes_per_second=cfg.placement_writes_per_second,
            republish=lambda: self.publisher.request_republish(),  # noqa: PLW0108 - the publisher is built next, with this ordering
            live=self.live,
        )
        self.telemetry.add_collector(
            ordering.PlacementCollector(self.ordering, node_name=cfg.node_name, driver_name=cfg.driver_name)
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
        self.health = InventoryHealth(self.served.inventory, cfg.pool_name, self.publisher.pool.device_names)
        self.driver = NpuDriver(self.preparer, telemetry=self.telemetry)
        self.telemetry.serve_health(self.live.healthz, self.live.ages)
        if cfg.daemon_socket is not None:  # per-vNPU usage series (dra_driver/usage_metrics.py)
            self.telemetry.add_collector(
                usage_metrics.VnpuUsageCollector(
                    daemon=DaemonClient(cfg.daemon_socket, timeout=3.0),
                    kube=self.kube,
                    inventory=lambda: self.served.inventory,
                    node_name=cfg.node_name,
                    driver_name=cfg.driver_name,
                    max_shares_per_die=cfg.max_shares_per_die,
                    ledger=functools.partial(ledger.read_entries, str(cfg.paths.shm_root / LEDGER_DIR_NAME)),
                    delay_bound_seconds=cfg.latency_delay_bound_seconds,
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
            health=self.health,
            notify_health=self.helper.notify_health_changed,
            daemon=self.daemon,
        )
        held = {d.phy for e in self.store.entries().values() for d in e.dies}  # dies a claim holds stay
        rediscovery.hold_back_unserved(held)  # the first publish too: only what every part serves
        self.publisher.start(self.helper)
        self.ordering.start(self.stop_event)
        self.health.published = set(self.publisher.pool.device_names)
        self._thread("reconciler", self.reconciler.run, self.stop_event)
        if self.daemon is not None:
            watch = healing.AclserverWatch(
                preparer=self.preparer, daemon=self.daemon, store=self.store, get_claim=self.kube.get_claim
            )
            shm = healing.ShmReport(
                daemon=self.daemon, create_event=self.kube.create_event, node_name=cfg.node_name
            )
            aclservers = healing.AclserverPass(watch=watch, shm=shm, events=self.events)
            self._loop(LOOP_ACLSERVERS, aclservers.iteration, deadline=healing.ACLSERVER_PERIOD * 5 + 60)
        self.readiness = ReadinessWriter(readiness.path_for(cfg.paths.run_dir, cfg.pod_uid), self.helper)
        self._loop(LOOP_READINESS, self.readiness.iteration, deadline=READINESS_PERIOD * 10 + 60)
        if rediscovery.needed:
            self._loop(LOOP_REDISCOVER, rediscovery.iteration, deadline=rediscovery.period * 2 + 120)
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

    def _loop(self, name: str, iteration: Callable[[], float | None], *, deadline: float) -> None:
        """Run ``iteration`` in a thread that cannot die silently (dra_driver/liveness.py)."""
        self.live.register(name, deadline=deadline)
        self._thread(name, liveness.run_forever, self.live, name, iteration, self.stop_event, logger=log)

    def _thread(self, name: str, target: Callable[..., None], *args: object, **kwargs: object) -> None:
        t = threading.Thread(target=target, args=args, kwargs=kwargs, name=name, daemon=True)
        t.start()
        self.threads.append(t)

    def stop(self) -> None:
        self.stop_event.set()
        self.reconciler.trigger()
        self.ordering.trigger()  # its loop waits for a change: wake it to see the stop

    def wait(self) -> None:
        while not self.stop_event.wait(0.2):
            pass  # short steps: the kernel may give SIGTERM to another thread, and Python runs its
            # handler only when the main thread runs again (a wait without a timeout never would)
        self.helper.stop(grace=5.0)
        for t in self.threads:
            t.join(timeout=10)
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

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: shutting down", signum)
        node.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        node.start()
    except FlexNPUError as err:
        log.error("cannot start: %s", err)
        return 2
    node.wait()
    return 0
