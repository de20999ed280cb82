"""The node process: kubelet plugin plus controllers, wired from one :class:`Config`.

Start order: discover dies → open the checkpoint (a corrupt one is kept aside, never fatal)
→ serve DRA on the plugin socket, then registration → load the Kubernetes client (the costliest
import, so it comes after the kubelet can register us; bench/bench_startup.py) → publish
ResourceSlices and run the reconciler in threads.
SIGTERM/SIGINT: stop publishing, stop serving, remove both sockets. Running aclservers and
prepared claims are not touched, so a restart or rolling update is seamless.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import dra_kubeletplugin
from controller.cleanup import Reconciler
from controller.kube import Kube
from controller.status import ClaimStatusWriter
from dra_driver import (
    cdi,
    discovery,
    liveness,
    logs,
    netlink,
    readiness,
    records,
    rediscovery,
    slices,
    sweep,
    usage_metrics,
    vnpu,
)
from dra_driver.checkpoint import CheckpointStore
from dra_driver.config import Config
from dra_driver.daemon_api.client import DaemonClient
from dra_driver.daemon_api.values import LEDGER_DIR_NAME
from dra_driver.devices import Die, DieMode, Inventory
from dra_driver.errors import FlexNPUError
from dra_driver.sharing import Policy
from dra_driver.telemetry import Telemetry
from dra_driver.vnpu import sweeping
from dra_kubeletplugin import Helper
from dra_kubeletplugin.errors import DroppedFieldsError, PluginError
from dra_kubeletplugin.helper import PublishOptions
from dra_kubeletplugin.resourceslice.pools import DriverResources
from flexnpu_runtime.aclserver import ledger
from kubeletplugin import error_status, hardsplit, healing
from kubeletplugin.driver import NpuDriver
from kubeletplugin.health import InventoryHealth
from kubeletplugin.prepare import Preparer, PrepareSettings

log = logging.getLogger("flexnpu.node")

LOOP_ACLSERVERS = "aclserver-monitor"
LOOP_REDISCOVER = "rediscover"
LOOP_READINESS = "readiness"
READINESS_PERIOD = 0.5
ACLSERVER_PERIOD = healing.ACLSERVER_PERIOD


class NodeCore:
    """The parts of the node shared by the node process and ``flexnpu-smi``: no servers, no threads."""

    def __init__(self, cfg: Config, *, kube: Kube | None = None, telemetry: Telemetry | None = None) -> None:
        self.cfg = cfg
        self._inventory: Inventory | None = None  # discovered on first use (flexnpu-smi may not need it)
        self.kube = kube or Kube.deferred(cfg.kubeconfig)  # connected in start(), after registration
        self.store = CheckpointStore(cfg.paths.checkpoint_file)
        self.store.read()  # surfaces (and sets aside) a corrupt checkpoint at start
        self.link = netlink.LinkSpec(cfg.control_link, cfg.control_link_cidr, cfg.control_link_kind)
        if cfg.control_link:
            self.link.validate()
        self.daemon = DaemonClient(cfg.daemon_socket, timeout=20.0) if cfg.daemon_socket else None
        self.telemetry = telemetry or Telemetry(
            node_name=cfg.node_name, driver_name=cfg.driver_name, enabled=False
        )
        self.live = liveness.Liveness(on_error=self.telemetry.loop_error)
        # Hard-split vNPUs (dra_driver/vnpu): the manager, and whether any die publishes templates.
        self.vnpus = vnpu.from_config(
            inventory=self.inventory,
            emulated=cfg.inventory is not None,
            device_root=cfg.paths.device_root,
            npu_smi=cfg.npu_smi,
        )
        self.hard_split = cfg.default_mode in ("hard", "all") or any(
            str(m) in ("hard", "all") for m in self.inventory.die_modes.values()
        )
        self._foreign: tuple[vnpu.Vnpu, ...] = ()
        self.withheld: frozenset[int] = frozenset()
        """Dies discovered but not published yet: not every part that serves them can (rediscovery)."""
        self.preparer = Preparer(
            settings=PrepareSettings(
                driver_name=cfg.driver_name,
                pool_name=cfg.pool_name,
                cdi_dir=cfg.paths.cdi_dir,
                cdi_kind=cdi.Kind.parse(cfg.cdi_kind),
                device_root=cfg.paths.device_root,
                run_dir=cfg.paths.run_dir,
                control_link=cfg.control_link,
                control_address=self.link.address if cfg.control_link else "127.0.0.1",
                control_cidr=cfg.control_link_cidr if cfg.control_link else "",
                daemon_retry_seconds=cfg.daemon_retry_seconds,
                client_library=cfg.client_library,
            ),
            store=self.store,
            inventory=lambda: self.inventory,
            daemon=self.daemon,
            status=ClaimStatusWriter(self.kube, driver_name=cfg.driver_name, node_name=cfg.node_name),
            telemetry=self.telemetry,
            hard=hardsplit.HardVnpus(self.vnpus, lambda: self.inventory, cfg.paths.state_dir)
            if self.hard_split
            else None,
        )
        self.reconciler = Reconciler(
            kube=self.kube,
            preparer=self.preparer,
            driver_name=cfg.driver_name,
            node_name=cfg.node_name,
            pool_name=cfg.pool_name,
            places=sweep.SweepPlaces(
                cdi_dir=cfg.paths.cdi_dir,
                cdi_kind=cdi.Kind.parse(cfg.cdi_kind),
                run_dir=cfg.paths.run_dir,
                shm_dir=cfg.paths.shm_root,
                hard=sweeping.HardSweep(self.vnpus, lambda: self.inventory, cfg.paths.state_dir)
                if self.hard_split
                else None,
            ),
            daemon=self.daemon,
            grace_seconds=cfg.residual_grace_seconds,
            period_seconds=cfg.reconcile_period_seconds,
            telemetry=self.telemetry,
            live=self.live,
        )

    @property
    def inventory(self) -> Inventory:
        if self._inventory is None:
            self._inventory = discovery.from_config(
                inventory=self.cfg.inventory, npu_smi=self.cfg.npu_smi
            ).discover()
        return self._inventory

    @inventory.setter
    def inventory(self, value: Inventory) -> None:
        self._inventory = value

    def close(self) -> None:
        self.kube.close()
        if self.daemon is not None:
            self.daemon.close()


class NodeProcess(NodeCore):
    """Everything the node process runs; ``start()`` then ``wait()``; ``stop()`` from any thread."""

    def __init__(self, cfg: Config, *, kube: Kube | None = None) -> None:
        super().__init__(
            cfg,
            kube=kube,
            telemetry=Telemetry(
                node_name=cfg.node_name,
                driver_name=cfg.driver_name,
                metrics_port=cfg.metrics_port,
                wait_for_port=cfg.pod_uid is not None,  # a rolling update's old pod may still hold it
            ),
        )
        self.stop_event = threading.Event()
        self.readiness_file = readiness.path_for(cfg.paths.run_dir, cfg.pod_uid)
        self.use_counters = True
        self.pool = self._desired()
        self.health = InventoryHealth(self.inventory, cfg.pool_name, self.pool.device_names)
        self.driver = NpuDriver(self.preparer, telemetry=self.telemetry)
        self.helper: Helper | None = None  # serving from start()
        self.telemetry.serve_health(self._health_verdict, self._loop_ages)
        if cfg.daemon_socket is not None:  # per-vNPU usage series (dra_driver/usage_metrics.py)
            self.telemetry.add_collector(
                usage_metrics.VnpuUsageCollector(
                    daemon=DaemonClient(cfg.daemon_socket, timeout=3.0),
                    kube=self.kube,
                    inventory=lambda: self.inventory,
                    node_name=cfg.node_name,
                    driver_name=cfg.driver_name,
                    max_shares_per_die=cfg.max_shares_per_die,
                    ledger=functools.partial(ledger.read_entries, str(cfg.paths.shm_root / LEDGER_DIR_NAME)),
                )
            )
        self._threads: list[threading.Thread] = []
        self._shm_problem = ""  # what the daemon last said about bounding shm dirs
        self._published_policies: dict[int, Policy] = {}
        self.preparer.after_batch = self._republish_policies

    def _health_verdict(self) -> tuple[bool, str]:
        verdict = self.live.verdict()
        return verdict.healthy, verdict.text

    def _loop_ages(self) -> dict[str, float]:
        now = self.live.clock()
        return {name: now - state.last_pass for name, state in self.live.snapshot().items()}

    def _counters_dropped(self, err: DroppedFieldsError) -> None:
        """The API server dropped the counter fields (DRAPartitionableDevices off): one mode per die."""
        if self.use_counters:
            log.warning("%s; publishing each die in one mode only (no whole+share on one die)", err)
            self.use_counters = False
            self._publish()

    def _publish(self) -> None:
        """Tell the helper what this node offers now (dies, modes, held capacity); it writes the difference.

        A pool the API server would refuse is logged and not published (what was published stays).
        """
        self.pool = self._desired()
        if self.helper is None:
            return
        try:
            self.helper.publish_resources(DriverResources.single(self.pool))
        except PluginError as err:
            log.error("not publishing this node's pool: %s", err)

    def mode_of(self, die: Die, inventory: Inventory) -> DieMode:
        return slices.resolve_mode(die, inventory, DieMode(self.cfg.default_mode))

    def _desired(self) -> slices.DesiredPool:
        published = self.inventory
        if self.withheld:
            published = dataclasses.replace(
                published, dies=tuple(d for d in published.dies if d.phy_id not in self.withheld)
            )
        return slices.build_pool(
            published,
            driver_name=self.cfg.driver_name,
            node_name=self.cfg.node_name,
            mode_of=lambda die: self.mode_of(die, published),
            use_counters=self.use_counters,
            max_shares_per_die=self.cfg.max_shares_per_die,
            held=self._held(),
            policies=self._share_policies(),
        )

    def _share_policies(self) -> dict[int, Policy]:
        """The policy each die's prepared shares run: its other share devices are not offered."""
        return {phy: Policy(p) for phy, p in records.share_policies(self.store.entries().values()).items()}

    def _held(self) -> dict[int, slices.Held]:
        """Capacity held by vNPUs made outside the driver: published without it, and reported."""
        if not self.hard_split:
            return {}
        foreign = sweeping.foreign_vnpus(self.vnpus, self.cfg.paths.state_dir)
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
        return sweeping.held_capacity(foreign, self.inventory)

    def start(self) -> None:
        self.cfg.paths.cdi_dir.mkdir(parents=True, exist_ok=True)
        if self.cfg.control_link:
            netlink.ensure_link(self.link)  # a clear error at start, never a hang
        self.telemetry.start()
        self._check_boot()
        cfg = self.cfg
        self.helper = dra_kubeletplugin.start(
            self.driver,
            driver_name=cfg.driver_name,
            node_name=cfg.node_name,
            kube=self.kube,
            pod_uid=cfg.pod_uid,
            registry_dir=cfg.paths.kubelet_registry_dir,
            plugins_dir=cfg.paths.kubelet_plugins_dir,
            health_source=self.health,
            error_status=error_status.status_for,
            publish=PublishOptions(resync_seconds=cfg.slice_resync_seconds),
            on_dropped_fields=self._counters_dropped,
            live=self.live,
            log=logs.claim_logger("-", base=logging.getLogger("flexnpu.publisher")),
        )
        try:
            self.kube.connect()  # the kubernetes client loads while the kubelet registers the plugin
        except FlexNPUError:
            self.helper.stop(grace=0)
            raise
        self._publish()
        r = threading.Thread(
            target=self.reconciler.run, args=(self.stop_event,), name="reconciler", daemon=True
        )
        r.start()
        self._threads.append(r)
        if self.daemon is not None:
            self._loop(LOOP_ACLSERVERS, self._aclserver_pass(), deadline=ACLSERVER_PERIOD * 5 + 60)
        self._loop(LOOP_READINESS, self._readiness_pass(), deadline=READINESS_PERIOD * 10 + 60)
        if self.cfg.rediscover_seconds > 0:
            self._loop(
                LOOP_REDISCOVER, self._rediscover_pass(), deadline=self.cfg.rediscover_seconds * 2 + 120
            )
        log.info(
            "node %s ready: %d dies, DRA socket %s, registration socket %s",
            self.cfg.node_name,
            len(self.inventory.dies),
            self.cfg.dra_socket,
            self.cfg.registration_socket,
        )

    def _loop(self, name: str, iteration: Callable[[], float | None], *, deadline: float) -> None:
        """Run ``iteration`` in a thread that cannot die silently (dra_driver/liveness.py)."""
        self.live.register(name, deadline=deadline)
        t = threading.Thread(
            target=liveness.run_forever,
            args=(self.live, name, iteration, self.stop_event),
            kwargs={"logger": log},
            name=name,
            daemon=True,
        )
        t.start()
        self._threads.append(t)

    def _leave_node(self) -> None:
        """A clean stop of the last instance on the node (an uninstall, not a rolling update, whose surge
        pod still serves): withdraw this node's slices at once (the kubelet would only after 30 s), and
        remove the control link when nothing is prepared here any more. On doubt (another instance
        may answer, the daemon does not, a claim is recorded) everything stays."""
        others = other_instances(
            self.cfg.paths.kubelet_registry_dir, self.cfg.driver_name, str(self.cfg.dra_socket)
        )
        if others:
            log.info(
                "stop: %d other instance(s) serve this node (%s); slices stay", len(others), ", ".join(others)
            )
            return
        if self.helper is None:
            return
        try:
            withdrawn = self.helper.withdraw_resources()
            log.info("stop: last instance on the node; withdrew %d ResourceSlice(s)", withdrawn)
        except FlexNPUError as err:
            log.warning("stop: could not withdraw the slices (the kubelet removes them 30 s after): %s", err)
        if not self.cfg.control_link or not self._nothing_prepared():
            return
        try:
            if netlink.remove_link(self.cfg.control_link):
                log.info(
                    "stop: nothing prepared on the node; removed the control link %s", self.cfg.control_link
                )
        except FlexNPUError as err:
            log.warning("stop: could not remove the control link %s: %s", self.cfg.control_link, err)

    def _nothing_prepared(self) -> bool:
        try:
            if self.store.read().claims:
                return False
            return self.daemon is None or not self.daemon.list()
        except FlexNPUError as err:
            log.info("stop: keeping the control link, cannot prove nothing is prepared: %s", err)
            return False

    def _readiness_pass(self) -> Callable[[], float | None]:
        """Record whether this instance serves (registered by the kubelet, pool published) for the
        readiness probe (dra_driver/readiness.py), on every change."""
        last: list[readiness.State | None] = [None]

        def iteration() -> float | None:
            state = readiness.State(
                registered=self.helper is not None and self.helper.registered.is_set(),
                published=self.helper is not None and self.helper.published.is_set(),
                pid=os.getpid(),
            )
            if state != last[0]:
                readiness.write(self.readiness_file, state)
                log.info("readiness: %s", "ready" if state.ready else f"not ready: {state.missing()}")
                last[0] = state
            return READINESS_PERIOD

        return iteration

    def _rediscover_pass(self) -> Callable[[], float | None]:
        """Discover the dies again; on a change (health, dies added or gone) republish and re-report health."""
        source = discovery.from_config(inventory=self.cfg.inventory, npu_smi=self.cfg.npu_smi)
        first = [True]

        def iteration() -> float | None:
            if first[0]:  # the inventory was just discovered at start
                first[0] = False
                return self.cfg.rediscover_seconds
            try:
                self._rediscover_once(source)
            except FlexNPUError as err:
                log.warning("rediscovery failed, keeping the last inventory: %s", err)
            return self.cfg.rediscover_seconds

        return iteration

    def _rediscover_once(self, source: discovery.Discovery) -> None:
        """Serve a changed inventory as one: make the node able to serve it (emulated device root, vNPU
        manager), then publish each die once every part that serves it can (dra_driver/rediscovery.py)."""
        fresh = source.discover()
        if fresh == self.inventory and not self.withheld:
            if self._desired() != self.pool:  # capacity held by vNPUs made outside the driver changed
                self._publish()
            return
        change = rediscovery.describe(self.inventory, fresh, self.mode_of)
        if change:
            log.warning("inventory changed: %s", change.text())
            self._serve_inventory(fresh)
        served_shared = {
            d.phy_id
            for d in self.inventory.dies
            if d.phy_id not in self.withheld and rediscovery.needs_daemon(self.mode_of(d, self.inventory))
        }
        withheld = rediscovery.withheld(
            fresh, self.mode_of, daemon_dies=self._daemon_dies(), served_shared=served_shared
        )
        if withheld:
            log.warning(
                "die(s) %s not published yet: flexnpu-daemon does not serve them yet (it discovers again every"
                " --rediscover-seconds)",
                sorted(withheld),
            )
        elif self.withheld:
            log.info("die(s) %s now served by flexnpu-daemon: publishing them", sorted(self.withheld))
        if fresh == self.inventory and withheld == self.withheld:
            return
        self.inventory = fresh
        self.withheld = withheld
        self.health.inventory = fresh
        self._publish()
        self.health.published = set(self.pool.device_names)
        if self.helper is not None:
            self.helper.notify_health_changed()

    def _serve_inventory(self, fresh: Inventory) -> None:
        """Before a changed inventory is published: the emulated device nodes of new dies, and a vNPU
        manager that knows them when any die now offers templates."""
        if self.cfg.build_device_root:
            from dra_driver import devroot

            devroot.build_for_config(self.cfg)
        needs_hard = any(self.mode_of(d, fresh) in rediscovery.HARD_MODES for d in fresh.dies)
        if needs_hard:
            self.vnpus = vnpu.from_config(
                inventory=fresh,
                emulated=self.cfg.inventory is not None,
                device_root=self.cfg.paths.device_root,
                npu_smi=self.cfg.npu_smi,
            )
            if self.preparer.hard is None:
                log.info("a die now offers hard-split templates: the vNPU manager is started")
            self.hard_split = True
            self.preparer.set_hard(
                hardsplit.HardVnpus(self.vnpus, lambda: self.inventory, self.cfg.paths.state_dir)
            )
            self.reconciler.places = dataclasses.replace(
                self.reconciler.places,
                hard=sweeping.HardSweep(self.vnpus, lambda: self.inventory, self.cfg.paths.state_dir),
            )

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

    def _check_boot(self) -> None:
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

    def _aclserver_pass(self) -> Callable[[], float | None]:
        """Each pass: the daemon's shm problem, a republish when a die's share policy changed, then one
        look of the aclserver watch (each share's aclserver state in its claim's Ready condition, lost
        ones registered again: ``kubeletplugin/healing.py``)."""
        assert self.daemon is not None
        watch = healing.AclserverWatch(
            preparer=self.preparer, daemon=self.daemon, store=self.store, get_claim=self.kube.get_claim
        )

        def iteration() -> float:
            self._report_shm()
            self._republish_policies()
            return watch.look()

        return iteration

    def _republish_policies(self) -> None:
        """Republish when a die's share policy changed (its first share prepared, its last gone):
        after every kubelet call, and in the aclserver pass for what the reconciler removed."""
        policies = self._share_policies()
        if policies != self._published_policies:
            self._published_policies = policies
            self._publish()

    def _report_shm(self) -> None:
        """Say, in the log and a Node Event, when the daemon cannot bound a share's shm dir (once a change)."""
        assert self.daemon is not None
        try:
            problem = self.daemon.health().shm_problem
        except FlexNPUError:
            return
        if problem and problem != self._shm_problem:
            log.error("flexnpu-daemon refuses every new share on this node: %s", problem)
            try:
                self.kube.create_event(
                    involved={
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self.cfg.node_name,
                        "namespace": "default",
                    },
                    reason="FlexNPUShmUnbounded",
                    message=f"shares are refused on this node: {problem}",
                    event_type="Warning",
                    host=self.cfg.node_name,
                )
            except FlexNPUError as err:
                log.info("could not post the FlexNPUShmUnbounded event: %s", err)
        self._shm_problem = problem

    def stop(self) -> None:
        self.stop_event.set()
        self.reconciler.trigger()

    def wait(self) -> None:
        while not self.stop_event.wait(0.2):
            pass  # short steps: the kernel may give SIGTERM to another thread, and Python runs its
            # handler only when the main thread runs again (a wait without a timeout never would)
        if self.helper is not None:
            self.helper.stop(grace=5.0)
        for t in self._threads:
            t.join(timeout=10)
        self._leave_node()
        self.close()
        self.telemetry.shutdown()
        readiness.remove(self.readiness_file)
        log.info("node process stopped; sockets removed")


def other_instances(
    registry_dir: Path, driver_name: str, own_endpoint: str, *, timeout: float = 2.0
) -> list[str]:
    """Endpoints of other live instances of this driver: registration sockets in the kubelet's registry
    that answer GetInfo as this driver with another endpoint (a rolling update's other pod)."""
    import grpc

    from dra_kubeletplugin.protos.gen import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc

    found = []
    for sock in sorted(registry_dir.glob(f"{driver_name}*-reg.sock")):
        try:
            with grpc.insecure_channel(f"unix:{sock}") as channel:
                stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
                info = stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=timeout)
        except grpc.RpcError:
            continue  # a stale socket: nobody serves it
        if info.name == driver_name and info.endpoint != own_endpoint:
            found.append(info.endpoint)
    return found


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
