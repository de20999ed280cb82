"""The parts of the node shared by the node process (``kubeletplugin/node.py``) and ``flexnpu-smi``: no servers, no threads.

Each part is built once, here, complete: the checkpoint store, the served dies, the node's
vNPU side (whose :class:`~kubeletplugin.hardsplit.HardVnpus` and
:class:`~dra_driver.vnpu.sweeping.HardSweep` the preparer and the reconciler get), the preparer
(which emits the node's ``claims_changed`` events) and the reconciler.
"""

from __future__ import annotations

import logging

from controller.cleanup import Reconciler
from controller.kube import Kube
from controller.status import ClaimStatusWriter
from dra_driver import cdi, discovery, liveness, netlink, sweep
from dra_driver.checkpoint import CheckpointStore
from dra_driver.config import Config
from dra_driver.daemon_api.client import DaemonClient
from dra_driver.telemetry import Telemetry
from kubeletplugin.events import NodeEvents
from kubeletplugin.prepare import Preparer, PrepareSettings
from kubeletplugin.served import ServedDies
from kubeletplugin.vnpus import NodeVnpus

__all__ = ["NodeCore"]

log = logging.getLogger("flexnpu.node")


class NodeCore:
    """The parts of the node shared by the node process and ``flexnpu-smi``: no servers, no threads."""

    def __init__(self, cfg: Config, *, kube: Kube | None = None, serve_metrics: bool = False) -> None:
        """``serve_metrics``: the node process's telemetry (metrics, traces, ``/healthz`` on
        ``--metrics-port``); without it (``flexnpu-smi``) telemetry records nothing."""
        self.cfg = cfg
        self.kube = kube or Kube.deferred(cfg.kubeconfig)  # connected in start(), after registration
        self.store = CheckpointStore(cfg.paths.checkpoint_file)
        self.store.read()  # surfaces (and sets aside) a corrupt checkpoint at start
        self.link = netlink.LinkSpec(cfg.control_link, cfg.control_link_cidr, cfg.control_link_kind)
        if cfg.control_link:
            self.link.validate()
        self.daemon = DaemonClient(cfg.daemon_socket, timeout=20.0) if cfg.daemon_socket else None
        self.telemetry = (
            Telemetry(
                node_name=cfg.node_name,
                driver_name=cfg.driver_name,
                metrics_port=cfg.metrics_port,
                otlp_endpoint=cfg.otlp_endpoint,
                wait_for_port=cfg.pod_uid is not None,  # a rolling update's old pod may still hold the port
            )
            if serve_metrics
            else Telemetry(node_name=cfg.node_name, driver_name=cfg.driver_name, enabled=False)
        )
        self.live = liveness.Liveness(on_error=self.telemetry.loop_error)
        self.events = NodeEvents()
        source = discovery.from_config(inventory=cfg.inventory, npu_smi=cfg.npu_smi)
        self.served = ServedDies(source.discover, default_mode=cfg.default_mode)
        self.vnpus = NodeVnpus(
            inventory=lambda: self.served.inventory,
            emulated=cfg.inventory is not None,
            device_root=cfg.paths.device_root,
            npu_smi=cfg.npu_smi,
            state_dir=cfg.paths.state_dir,
            on=cfg.default_mode in ("hard", "all")
            or any(str(m) in ("hard", "all") for m in self.served.inventory.die_modes.values()),
        )
        self.preparer = Preparer(
            settings=PrepareSettings.from_config(cfg, self.link),
            store=self.store,
            inventory=lambda: self.served.inventory,
            daemon=self.daemon,
            status=ClaimStatusWriter(self.kube, driver_name=cfg.driver_name, node_name=cfg.node_name),
            telemetry=self.telemetry,
            hard=self.vnpus.effects,
            events=self.events,
        )
        places = sweep.SweepPlaces(
            cdi_dir=cfg.paths.cdi_dir,
            cdi_kind=cdi.Kind.parse(cfg.cdi_kind),
            run_dir=cfg.paths.run_dir,
            shm_dir=cfg.paths.shm_root,
            hard=self.vnpus.sweep,
        )
        self.reconciler = Reconciler(
            kube=self.kube,
            preparer=self.preparer,
            driver_name=cfg.driver_name,
            node_name=cfg.node_name,
            pool_name=cfg.pool_name,
            places=places,
            daemon=self.daemon,
            grace_seconds=cfg.residual_grace_seconds,
            period_seconds=cfg.reconcile_period_seconds,
            telemetry=self.telemetry,
            live=self.live,
        )

    def close(self) -> None:
        self.kube.close()
        if self.daemon is not None:
            self.daemon.close()

    def check_boot(self) -> None:
        """After a reboot the tmpfs state (CDI specs, client.conf, shm) and the aclservers are gone.

        Entries stay: the kubelet prepares its running pods' claims again and the prepare path
        puts back what is missing; the reconciler drops the rest.
        """
        with self.preparer.locked() as cp:
            if cp.claims and cp.boot_id and cp.boot_id != self.store.boot_id:
                log.warning(
                    "the node rebooted since the checkpoint was written (boot %s, now %s): %d claim(s) "
                    "will be restored when the kubelet prepares them again, the rest removed by the reconciler",
                    cp.boot_id,
                    self.store.boot_id,
                    len(cp.claims),
                )
            cp.boot_id = self.store.boot_id
        self.reconciler.trigger()
