"""A cluster of publishing nodes, the scheduler extender and the fake kube-scheduler, for placement.

Each :class:`PublishingNode` runs the node process's real publishing parts for one node — the
pool of ``dra_driver/slices.py``, the helper's ResourceSlice controller and the die-level
ordering of ``kubeletplugin/ordering.py`` with its claim watch — against the fake API server;
no kubelet side (nothing is prepared: the order comes from allocations, not preparations).
:class:`PlacementCluster` adds the DeviceClasses, the Node objects, optionally the extender
(``controller/extender.py``, HTTPS with a self-signed certificate made by ``openssl``) and a
:class:`~flexnpu_testing.cluster.ClusterScheduler` that calls it.

With ``processes=True`` the fake API server and the nodes run as their own processes (the nodes
through this module's ``main``: ``python -m flexnpu_testing.placement_cluster``), as in a cluster.

Usage::

    with PlacementCluster(tmp_path, nodes=8, policy=Placement.BINPACK, extender=True) as c:
        c.share_pod("p0", compute=25)
        c.scheduler.schedule(c.pods["p0"])
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import kubernetes.client

from controller.extender import Extender
from controller.kube import Kube
from dra_driver import discovery, placement, slices
from dra_driver.config import ExtenderConfig
from dra_driver.devices import DieMode, Inventory
from dra_driver.liveness import handle_signals
from dra_driver.placement import Placement
from dra_kubeletplugin.resourceslice.controller import SliceController
from dra_kubeletplugin.resourceslice.pools import DriverResources
from flexnpu_testing.cluster import ClusterScheduler, ExtenderSpec
from flexnpu_testing.fake_apiserver import FakeAPIServer
from flexnpu_testing.waiting import wait_for
from kubeletplugin import node as node_process
from kubeletplugin.ordering import DeviceOrdering

DRIVER = "npu.flexnpu.io"
NAMESPACE = "placement"
INVENTORY = Path(__file__).resolve().parent / "inventories" / "eight-910b4.yaml"
CLASSES = {
    "vnpu.flexnpu.io": 'device.attributes["npu.flexnpu.io"].mode == "soft"',
    "npu.flexnpu.io": 'device.attributes["npu.flexnpu.io"].mode == "whole"',
    "vnpu-template.flexnpu.io": 'device.attributes["npu.flexnpu.io"].mode == "hard"',
}
PUBLISH_DEBOUNCE = node_process.PUBLISH_DEBOUNCE
"""The node's slice controller debounce (kubeletplugin/node.py)."""
WATCH_HISTORY = 100_000

Obj = dict[str, Any]


def _body(doc: Obj) -> Any:
    """A wire-JSON body for the official client's typed create calls (it sends dicts as they are)."""
    return doc


def share_request(compute: int = 25) -> Obj:
    """A claim request (``exactly``) for one share of ``compute`` % of a die."""
    return {"deviceClassName": "vnpu.flexnpu.io", "capacity": {"requests": {"compute": str(compute)}}}


def whole_request() -> Obj:
    """A claim request (``exactly``) for one whole die."""
    return {"deviceClassName": "npu.flexnpu.io"}


def template_request(template: str = "vir05_1c_8g") -> Obj:
    """A claim request (``exactly``) for one hard-split instance of ``template``."""
    return {
        "deviceClassName": "vnpu-template.flexnpu.io",
        "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].template == "{template}"'}}],
    }


def device_class(name: str) -> Obj:
    """The DeviceClass ``name`` of :data:`CLASSES` as the cluster creates it (wire JSON)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}" && {CLASSES[name]}'}}]},
    }


class PublishingNode:
    """One node's publisher with the die-level ordering, as the node process wires them."""

    def __init__(
        self,
        kube: Kube,
        name: str,
        inventory: Inventory,
        *,
        mode: DieMode,
        policy: Placement,
        writes_per_second: float,
    ) -> None:
        self.name = name
        self.base = build_base(inventory, name, mode)
        self.controller = SliceController(
            kube.for_helper(),  # the helper sees its own errors, as on a node
            driver_name=DRIVER,
            node_name=name,
            log=logging.getLogger(f"placement.{name}"),
            resync_seconds=0,
            debounce_seconds=PUBLISH_DEBOUNCE,
        )
        self.ordering = DeviceOrdering(
            kube,
            driver_name=DRIVER,
            pool_name=name,
            policy=policy,
            writes_per_second=writes_per_second,
            republish=self.republish,
        )
        self._lock = threading.Lock()
        self.current = self.ordering.order(self.base)
        self.controller.update(DriverResources.single(self.current))

    def republish(self) -> bool:
        with self._lock:
            desired = self.ordering.order(self.base)
            if desired == self.current:
                return False
            self.current = desired
            self.controller.update(DriverResources.single(desired))
            return True

    def start(self, stop: threading.Event) -> None:
        threading.Thread(
            target=self.controller.run, args=(stop,), name=f"slices-{self.name}", daemon=True
        ).start()
        self.ordering.start(stop)


def build_base(inventory: Inventory, name: str, mode: DieMode) -> slices.DesiredPool:
    """A node's pool as ``dra_driver/slices.py`` builds it, every die in ``mode`` (static order)."""
    return slices.build_pool(inventory, driver_name=DRIVER, node_name=name, mode_of=lambda _d: mode)


def start_nodes(
    kube: Callable[[], Kube],
    names: list[str],
    inventory: Inventory,
    *,
    mode: DieMode,
    policy: Placement,
    writes_per_second: float,
    stop: threading.Event,
) -> dict[str, PublishingNode]:
    """A :class:`PublishingNode` per name (each on ``kube()``), started; returns once each published."""
    nodes: dict[str, PublishingNode] = {}
    for name in names:
        node = PublishingNode(
            kube(), name, inventory, mode=mode, policy=policy, writes_per_second=writes_per_second
        )
        nodes[name] = node
        node.start(stop)
    wait_for(
        lambda: all(n.controller.published.is_set() for n in nodes.values()),
        what="every node published",
        timeout=60,
    )
    return nodes


def _stats(node: PublishingNode) -> dict[str, int]:
    o = node.ordering
    return {"republishes": o.republishes, "equivalent": o.equivalent, "unchanged": o.unchanged}


def make_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA), made with the openssl CLI."""
    cert, key = directory / "extender.crt", directory / "extender.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=flexnpu-extender",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


class PlacementCluster:
    """Nodes publishing in policy order, an optional extender, and the fake kube-scheduler.

    **Parameters:**
    * workdir - for the kubeconfig and the certificate.
    * nodes - how many nodes (``node-00``...), each with the eight-910B4 inventory.
    * policy - the nodes' ``--placement`` and the extender's default.
    * extender - serve the extender and configure the scheduler with it (weight ``weight``).
    * mode - every die's mode (``both``: whole and shares; ``all``: templates too; ``whole``).
    * publishing - run the nodes' publishers with ordering (False: publish the empty-node order once).
    * extender_process - run ``flexnpu-dra extender`` as its own process (the bench) instead of in
      this process (tests that read its counters and spans).
    * processes - run the fake API server and the nodes each as their own process (``python -m
      flexnpu_testing.fake_apiserver``, ``python -m flexnpu_testing.placement_cluster``), as in a
      cluster, where the scheduler shares no interpreter with them: this process then runs the
      scheduler only (the bench's throughput figures). ``nodes`` is then empty: see :meth:`node_stats`.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        nodes: int = 8,
        policy: Placement = Placement.BINPACK,
        extender: bool = True,
        weight: int = 5,
        mode: DieMode = DieMode.BOTH,
        writes_per_second: float = 4.0,
        publishing: bool = True,
        seed: int = 1,
        extender_process: bool = False,
        processes: bool = False,
    ) -> None:
        self.workdir = workdir
        self.node_names = [f"node-{i:02d}" for i in range(nodes)]
        self.policy, self.mode, self.weight = policy, mode, weight
        self.use_extender, self.writes_per_second, self.publishing = extender, writes_per_second, publishing
        self.seed = seed
        self.extender_process = extender_process
        self.extender_proc: subprocess.Popen[bytes] | None = None
        self.processes = processes
        self.server: FakeAPIServer | None = None if processes else FakeAPIServer(watch_history=WATCH_HISTORY)
        self.server_proc: subprocess.Popen[str] | None = None
        self.nodes_proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.bases: dict[str, slices.DesiredPool] = {}
        """Each node's pool as built (static order): what :meth:`usage` reads the devices from."""
        self.stop_event = threading.Event()
        self.extender_stop = threading.Event()
        self.nodes: dict[str, PublishingNode] = {}
        self.pods: dict[str, Obj] = {}
        self.extender: Extender | None = None
        self._kubes: list[Kube] = []
        self._exit = contextlib.ExitStack()

    # ---- lifecycle

    def __enter__(self) -> PlacementCluster:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object | TracebackType | None) -> None:
        self.close()

    def _kube(self) -> Kube:
        kube = Kube.from_config(str(self.kubeconfig))
        self._kubes.append(kube)
        return kube

    def api_client(self) -> kubernetes.client.ApiClient:
        cfg = kubernetes.client.Configuration()
        cfg.host = self.url
        return kubernetes.client.ApiClient(cfg)

    def _start_server(self) -> None:
        if self.server is not None:
            self.server.start()
            self.url = self.server.url
            self.kubeconfig = self.server.write_kubeconfig(self.workdir / "kubeconfig")
            return
        self.kubeconfig = self.workdir / "kubeconfig"
        self.server_proc = self._child(
            "apiserver",
            ["-m", "flexnpu_testing.fake_apiserver", "--kubeconfig-out", str(self.kubeconfig),
             "--watch-history", str(WATCH_HISTORY)],
        )  # fmt: skip
        self.url = self._line(self.server_proc, "the fake API server's URL")

    def _child(self, name: str, args: list[str]) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXNPU_")}
        log = (self.workdir / f"{name}.log").open("ab")
        self._exit.callback(log.close)
        return subprocess.Popen(
            [sys.executable, *args], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=log, text=True, cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip

    @staticmethod
    def _line(proc: subprocess.Popen[str], what: str) -> str:
        """The child's next stdout line (it answers when it is ready); its end is an error."""
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{what}: the child process ended (exit {proc.wait(timeout=10)})")
        return line.strip()

    def _start(self) -> None:
        self._start_server()
        api = self.api_client()
        core = kubernetes.client.CoreV1Api(api)
        resource = kubernetes.client.ResourceV1Api(api)
        core.create_namespace(
            _body({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        )
        for name in CLASSES:
            resource.create_device_class(_body(device_class(name)))
        inventory = discovery.from_config(inventory=INVENTORY, npu_smi="npu-smi").discover()
        for name in self.node_names:
            core.create_node(
                _body({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                 "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"}}})
            )  # fmt: skip
        kube = self._kube()
        for name in self.node_names:
            self.bases[name] = build_base(inventory, name, self.mode)
        if self.processes:
            self.nodes_proc = self._child(
                "nodes",
                ["-m", "flexnpu_testing.placement_cluster", "--kubeconfig", str(self.kubeconfig),
                 "--mode", str(self.mode), "--policy", str(self.policy),
                 "--writes-per-second", str(self.writes_per_second if self.publishing else 0),
                 *(["--static"] if not self.publishing else []), *self.node_names],
            )  # fmt: skip
            if (answer := self._line(self.nodes_proc, "the nodes process")) != "ready":
                raise RuntimeError(f"the nodes process answered {answer!r}, not ready")
        else:
            self.nodes = start_nodes(
                lambda: kube if not self.publishing else self._kube(),
                self.node_names,
                inventory,
                mode=self.mode,
                policy=self.policy,
                writes_per_second=self.writes_per_second if self.publishing else 0,
                stop=self.stop_event,
            )
        specs = []
        if self.use_extender and self.extender_process:
            cert, _key = make_cert(self.workdir)
            port = self._start_extender_process(cert, _key)
            specs.append(
                ExtenderSpec(
                    url_prefix=f"https://127.0.0.1:{port}", weight=self.weight,
                    node_cache_capable=True, ignorable=True, ca_file=cert,
                )
            )  # fmt: skip
        elif self.use_extender:
            cert, key = make_cert(self.workdir)
            settings = ExtenderConfig(
                driver_name=DRIVER, kubeconfig=str(self.kubeconfig), placement=self.policy,
                host="127.0.0.1", port=0, tls_cert=cert, tls_key=key,
            )  # fmt: skip
            self.extender = Extender(settings, kube=self._kube())
            ready = threading.Event()
            threading.Thread(
                target=self.extender.serve, args=(self.extender_stop, ready), name="extender", daemon=True
            ).start()
            wait_for(ready.is_set, what="the extender serving", timeout=30)
            wait_for(
                lambda: self.extender is not None and self.extender.scores.synced, what="extender synced"
            )
            specs.append(
                ExtenderSpec(
                    url_prefix=f"https://127.0.0.1:{self.extender.port}", weight=self.weight,
                    node_cache_capable=True, ignorable=True, ca_file=cert,
                )
            )  # fmt: skip
        self.scheduler = ClusterScheduler(api, DRIVER, nodes=self.node_names, extenders=specs, seed=self.seed)
        self.scheduler.start()

    def _start_extender_process(self, cert: Path, key: Path) -> int:
        """``flexnpu-dra extender`` as its own process (as in a cluster: no GIL shared with the scheduler)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXNPU_")}
        log = (self.workdir / "extender.log").open("ab")
        self._exit.callback(log.close)
        self.extender_proc = subprocess.Popen(
            [sys.executable, "-m", "kubeletplugin.cli", "extender", "--kubeconfig", str(self.kubeconfig),
             "--driver-name", DRIVER, "--placement", str(self.policy), "--extender-host", "127.0.0.1",
             "--extender-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key)],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip
        ctx = ssl.create_default_context(cafile=str(cert))

        def synced() -> bool:
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx, timeout=2) as r:
                    return bool(r.read() == b"ok\n")
            except OSError:
                return False

        wait_for(synced, what="the extender process serving and synced", timeout=60)
        return port

    def stop_extender(self) -> None:
        self.extender_stop.set()
        if self.extender_proc is not None and self.extender_proc.poll() is None:
            self.extender_proc.terminate()
            self.extender_proc.wait(timeout=20)

    def close(self) -> None:
        self.stop_event.set()
        with contextlib.suppress(Exception):
            self.stop_extender()
        if self.extender_proc is not None and self.extender_proc.poll() is None:
            self.extender_proc.kill()
            self.extender_proc.wait()
        self._exit.close()
        for node in self.nodes.values():
            node.ordering.trigger()
        with contextlib.suppress(Exception):
            self.scheduler.stop()
        for node in self.nodes.values():
            node.ordering.join(timeout=5)
        for kube in self._kubes:
            kube.close()
        for proc in (self.nodes_proc, self.server_proc):
            if proc is not None and proc.poll() is None:
                assert proc.stdin is not None
                with contextlib.suppress(OSError):
                    proc.stdin.close()  # the nodes process stops on its stdin's end
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.server is not None:
            self.server.stop()

    def node_stats(self) -> dict[str, dict[str, int]]:
        """Per node, the ordering's counts: ``republishes`` (the published order changed),
        ``equivalent`` (the policy's order changed but was first-fit equivalent to the published one:
        nothing written) and ``unchanged`` (an allocation that left the order as it was)."""
        if self.nodes_proc is None:
            return {name: _stats(n) for name, n in self.nodes.items()}
        assert self.nodes_proc.stdin is not None
        self.nodes_proc.stdin.write("stats\n")
        self.nodes_proc.stdin.flush()
        return dict(json.loads(self._line(self.nodes_proc, "the nodes process's counts")))

    # ---- workload

    def pod(self, name: str, request: Obj, *, node: str | None = None, annotations: Obj | None = None) -> Obj:
        """A pod with one claim of ``request`` (created in the API); ``node`` pins it (nodeSelector)."""
        resource = kubernetes.client.ResourceV1Api(self.api_client())
        claim_name = f"{name}-claim"
        resource.create_namespaced_resource_claim(
            NAMESPACE,
            _body({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": claim_name, "namespace": NAMESPACE},
             "spec": {"devices": {"requests": [{"name": "npu", "exactly": request}]}}}),
        )  # fmt: skip
        pod: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "uid": str(uuid.uuid4()),
                "annotations": annotations or {},
            },
            "spec": {
                "containers": [{"name": "app", "image": "busybox"}],
                "resourceClaims": [{"name": "npu", "resourceClaimName": claim_name}],
                **({"nodeSelector": {"kubernetes.io/hostname": node}} if node else {}),
            },
        }
        self.pods[name] = pod
        return pod

    def share_pod(self, name: str, *, compute: int = 25, **kw: Any) -> Obj:
        return self.pod(name, share_request(compute), **kw)

    def whole_pod(self, name: str, **kw: Any) -> Obj:
        return self.pod(name, whole_request(), **kw)

    def template_pod(self, name: str, template: str = "vir05_1c_8g", **kw: Any) -> Obj:
        return self.pod(name, template_request(template), **kw)

    # ---- what happened

    def usage(self) -> dict[str, dict[int, placement.DieUse]]:
        """Node -> die -> what is allocated there, read from the API."""
        items, _ = self._kubes[0].list_claims()
        out: dict[str, dict[int, placement.DieUse]] = {}
        for name, base in self.bases.items():
            results = placement.allocated_results(items, driver=DRIVER, pool=name)
            out[name] = placement.die_usage(results, placement.device_infos(base))
        return out

    def dies_used(self) -> set[tuple[str, int]]:
        return {(n, d) for n, dies in self.usage().items() for d, u in dies.items() if u.used}

    def picture(self) -> str:
        """An ASCII picture: a row per node, a cell per die (``.`` free, ``W`` whole, shares 1-9)."""
        rows = []
        for name, dies in self.usage().items():
            cells = []
            for phy in range(8):
                u = dies.get(phy, placement.DieUse())
                cells.append("W" if u.whole else ("." if not u.used else str(min(9, u.shares + u.templates))))
            rows.append(f"{name} [{' '.join(cells)}]")
        return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """``python -m flexnpu_testing.placement_cluster``: publishing nodes as their own process.

    Runs a :class:`PublishingNode` per node name against the API server of ``--kubeconfig``,
    prints ``ready`` once every node published, answers each ``stats`` line on stdin with a JSON
    line of :meth:`PlacementCluster.node_stats`, and stops at the end of stdin (or SIGTERM).
    """
    parser = argparse.ArgumentParser(prog="python -m flexnpu_testing.placement_cluster")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--mode", default=str(DieMode.BOTH), choices=[str(m) for m in DieMode])
    parser.add_argument("--policy", default=str(Placement.BINPACK))
    parser.add_argument("--writes-per-second", type=float, default=4.0)
    parser.add_argument("--static", action="store_true", help="one shared client, no ordering")
    parser.add_argument("nodes", nargs="+")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    stop = threading.Event()
    handle_signals(lambda _signum: stop.set(), (signal.SIGTERM,))
    kubes: list[Kube] = []

    def kube() -> Kube:
        if args.static and kubes:
            return kubes[0]
        kubes.append(Kube.from_config(args.kubeconfig))
        return kubes[-1]

    inventory = discovery.from_config(inventory=INVENTORY, npu_smi="npu-smi").discover()
    nodes = start_nodes(
        kube,
        args.nodes,
        inventory,
        mode=DieMode(args.mode),
        policy=Placement.parse(args.policy),
        writes_per_second=args.writes_per_second,
        stop=stop,
    )
    print("ready", flush=True)
    for line in sys.stdin:
        if stop.is_set():
            break
        if line.strip() == "stats":
            print(json.dumps({name: _stats(n) for name, n in nodes.items()}), flush=True)
    stop.set()
    for node in nodes.values():
        node.ordering.trigger()
        node.ordering.join(timeout=5)
    for k in kubes:
        k.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
