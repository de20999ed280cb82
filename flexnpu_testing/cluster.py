"""A stand-in for kube-scheduler's node choice (v1.36), with scheduler extenders, for tests and benches.

:class:`SchedulerSim` (``flexnpu_testing/scheduler.py``) allocates a claim on a node it is told;
:class:`ClusterScheduler` chooses the node, as kube-scheduler's scheduling cycle does:

1. **Filter**: every node on which each of the pod's claims can be allocated (the DRA allocator of
   ``SchedulerSim``, run on the scheduler's informer caches, not on API calls per node).
2. **One feasible node** is taken without scoring (as kube-scheduler does).
3. **Score**: the default plugins that score these pods — NodeResourcesFit ``LeastAllocated`` and
   NodeResourcesBalancedAllocation over CPU and memory, with the non-zero defaults for pods without
   requests (100m, 200Mi) — integer 0..100 each, weight 1. The DynamicResources plugin scores only
   ``firstAvailable`` indexes (0 here). So NPU pods spread by pod count.
4. **Extenders** (``extenders:`` of KubeSchedulerConfiguration): for each one interested in the pod
   (``managedResources`` empty, or the pod asks for one of them), an HTTP(S) ``POST
   <urlPrefix>/<prioritizeVerb>`` of ``ExtenderArgs`` JSON (``pod`` and ``nodes`` — a v1 NodeList —
   or ``nodenames`` when ``nodeCacheCapable``), answered by a ``HostPriorityList`` (``[{"host",
   "score"}]``); a node's score is ``score * weight * (MaxNodeScore / MaxExtenderPriority)`` = ``*
   weight * 10``. A prioritize error or timeout (``httpTimeout``, default 5 s) is ignored — no score
   from that extender — whether ``ignorable`` or not (kube-scheduler's ``prioritizeNodes``).
5. **selectHost**: the highest total; ties broken uniformly at random (seeded here).
6. **Assume and bind**: the claims' allocations are written (status), the informer cache takes them
   at once (kube-scheduler's assume cache), and the pod is recorded as bound to the node.

Differences on purpose: pods are the caller's dicts (v1.Pod JSON) and binding is recorded here,
not through ``pods/binding`` (the fake API server has none); an unschedulable pod is retried by
:meth:`ClusterScheduler.run` after a fixed backoff rather than kube-scheduler's queue.

Usage::

    sched = ClusterScheduler(srv.api_client(), "npu.flexnpu.io", nodes=["n1", "n2"],
                             extenders=[ExtenderSpec(url_prefix="https://127.0.0.1:8444", ca_file=ca)])
    sched.start()
    node = sched.schedule(pod)   # raises Unschedulable
"""

from __future__ import annotations

import http.client
import json
import random
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from flexnpu_testing.fake_apiserver.quantities import parse_quantity
from flexnpu_testing.scheduler import SchedulerSim, Unschedulable, _Node, node_from_slices

__all__ = ["ClusterScheduler", "ExtenderSpec", "Informer", "Unschedulable"]

Obj = dict[str, Any]
MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
NONZERO_CPU_MILLI = 100
NONZERO_MEMORY = 200 * 1024 * 1024
DEFAULT_ALLOCATABLE = {"cpu": "4", "memory": "16Gi"}
RESOURCE = "/apis/resource.k8s.io/v1"


@dataclass(frozen=True)
class ExtenderSpec:
    """One entry of KubeSchedulerConfiguration ``extenders:`` (the fields the prioritize path uses)."""

    url_prefix: str
    prioritize_verb: str = "prioritize"
    weight: int = 1
    node_cache_capable: bool = False
    ignorable: bool = True
    managed_resources: tuple[str, ...] = ()
    http_timeout: float = 5.0
    ca_file: Path | None = None


class _Connection(http.client.HTTPConnection):
    """``http.client``'s connection, sending a request with a bytes body in one write.

    Go's ``net/http`` (kube-scheduler's ``HTTPExtender`` POSTs through it) writes the request line,
    the header and the body into its connection's ``bufio.Writer`` and flushes once: one TLS
    record, one TCP segment for a small body. ``http.client`` sends the header and the body as two
    writes, which the server then reads as two records."""

    def _send_output(self, message_body: Any = None, encode_chunked: bool = False) -> None:
        if encode_chunked or not isinstance(message_body, bytes):
            super()._send_output(message_body, encode_chunked)  # type: ignore[misc]
            return
        lines: list[bytes] = self._buffer  # type: ignore[attr-defined]
        lines.extend((b"", message_body))
        msg = b"\r\n".join(lines)
        del lines[:]
        self.send(msg)


class _TLSConnection(_Connection, http.client.HTTPSConnection):
    """:class:`_Connection` over TLS."""


class ExtenderClient:
    """kube-scheduler's ``HTTPExtender`` for prioritize: one keep-alive connection per thread, each
    request written at once (:class:`_Connection`)."""

    def __init__(self, spec: ExtenderSpec) -> None:
        self.spec = spec
        url = urllib.parse.urlsplit(spec.url_prefix)
        self._https = url.scheme == "https"
        self._host, self._port = url.hostname or "127.0.0.1", url.port or (443 if self._https else 80)
        self._path = url.path.rstrip("/") + "/" + spec.prioritize_verb
        self._tls = ssl.create_default_context(cafile=str(spec.ca_file)) if spec.ca_file else None
        self._local = threading.local()
        self.calls = 0
        self.errors = 0
        self.seconds: list[float] = []

    def interested(self, pod: Obj) -> bool:
        """``IsInterested``: no managed resources, or a container asks for one of them."""
        if not self.spec.managed_resources:
            return True
        spec = pod.get("spec") or {}
        for ctr in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
            res = ctr.get("resources") or {}
            if set(self.spec.managed_resources) & {*(res.get("limits") or {}), *(res.get("requests") or {})}:
                return True
        return False

    def prioritize(self, pod: Obj, nodes: list[Obj]) -> dict[str, int]:
        """Host -> score 0..10 as the extender answered; raises on any failure (the caller ignores it)."""
        args: Obj = {"pod": pod}
        if self.spec.node_cache_capable:
            args["nodenames"] = [n["metadata"]["name"] for n in nodes]
        else:
            args["nodes"] = {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": nodes}
        body = json.dumps(args).encode()
        started = time.perf_counter()
        self.calls += 1
        try:
            answer = self._post(body)
        except Exception:
            self.errors += 1
            raise
        finally:
            self.seconds.append(time.perf_counter() - started)
        if not isinstance(answer, list):
            self.errors += 1
            raise ValueError(f"extender {self.spec.url_prefix}: not a HostPriorityList: {answer!r:.200}")
        return {str(h["host"]): int(h["score"]) for h in answer}

    def _post(self, body: bytes) -> Any:
        for attempt in (0, 1):  # a kept-alive connection the server closed: once more on a new one
            conn = self._conn()
            try:
                conn.request("POST", self._path, body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
                continue
            if resp.status != 200:
                raise OSError(f"extender {self.spec.url_prefix}: HTTP {resp.status}: {data[:200]!r}")
            return json.loads(data)
        raise AssertionError("unreachable")

    def _conn(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._https:
                conn = _TLSConnection(
                    self._host, self._port, timeout=self.spec.http_timeout, context=self._tls
                )
            else:
                conn = _Connection(self._host, self._port, timeout=self.spec.http_timeout)
            self._local.conn = conn
        return conn


class Informer:
    """A list-then-watch cache of one resource from raw JSON (an informer, without client models)."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        path: str,
        *,
        watch_timeout: int = 5,
        index: Callable[[Obj], str] | None = None,
    ) -> None:
        self._client, self._path, self._watch_timeout = api_client, path, watch_timeout
        self._lock = threading.Lock()
        self._items: dict[str, Obj] = {}
        self._rv = ""
        self.version = 0  # bumps on every change seen
        # An index (client-go's Indexer): index value -> key -> object, and a version per value
        # that bumps whenever an object with that value appears, changes or goes.
        self._index_fn = index
        self._index: dict[str, dict[str, Obj]] = {}
        self._index_versions: dict[str, int] = {}
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"informer{self._path}", daemon=True)
        self._thread.start()
        if not self.synced.wait(30):
            raise TimeoutError(f"informer {self._path}: no list within 30 s")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._watch_timeout + 5)

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._items.values())

    def index_version(self, value: str) -> int:
        with self._lock:
            return self._index_versions.get(value, 0)

    def get(self, key: str) -> Obj | None:
        """The cached object ``namespace/name`` (``/name`` when cluster-scoped), or None."""
        with self._lock:
            return self._items.get(key)

    def indexed(self, value: str) -> tuple[int, list[Obj]]:
        """The objects whose index value is ``value``, and that value's version (see ``index``)."""
        with self._lock:
            return self._index_versions.get(value, 0), list((self._index.get(value) or {}).values())

    def _reindex(self, key: str, old: Obj | None, new: Obj | None) -> None:
        """Under the lock: move ``key`` from ``old``'s index value to ``new``'s."""
        if self._index_fn is None:
            return
        for obj, keep in ((old, False), (new, True)):
            if obj is None:
                continue
            value = self._index_fn(obj)
            bucket = self._index.setdefault(value, {})
            if keep:
                bucket[key] = obj
            else:
                bucket.pop(key, None)
            self._index_versions[value] = self._index_versions.get(value, 0) + 1

    def _replace_all(self, items: list[Obj]) -> None:
        with self._lock:
            old = self._items
            self._items = {_key(o): o for o in items}
            self.version += 1
            for key, obj in old.items():
                self._reindex(key, obj, None)
            for key, obj in self._items.items():
                self._reindex(key, None, obj)

    def assume(self, obj: Obj) -> None:
        """Take an object the scheduler just wrote, unless the cache already has a newer version."""
        self._put(obj)

    def _put(self, obj: Obj) -> None:
        key = _key(obj)
        with self._lock:
            old = self._items.get(key)
            if old is not None and _rv(old) >= _rv(obj):
                return
            self._items[key] = obj
            self.version += 1
            self._reindex(key, old, obj)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._rv:
                    doc = self._get({})
                    self._replace_all(list(doc.get("items") or []))
                    self._rv = str(doc["metadata"]["resourceVersion"])
                    self.synced.set()
                for event in self._watch():
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        self._rv = ""  # 410 Gone: list again
                        break
                    self._rv = str((obj.get("metadata") or {}).get("resourceVersion") or self._rv)
                    if event.get("type") == "DELETED":
                        with self._lock:
                            gone = self._items.pop(_key(obj), None)
                            self.version += 1
                            self._reindex(_key(obj), gone, None)
                    elif event.get("type") in ("ADDED", "MODIFIED"):
                        self._put(obj)
            except (OSError, ValueError, ApiException, kubernetes.client.exceptions.OpenApiException):
                self._stop.wait(0.5)

    def _get(self, query: Obj) -> Obj:
        resp = self._request(query, timeout=30)
        return json.loads(resp.data)  # type: ignore[no-any-return]

    def _watch(self) -> Iterator[Obj]:
        resp = self._request(
            {"watch": "true", "resourceVersion": self._rv, "timeoutSeconds": self._watch_timeout},
            timeout=self._watch_timeout + 10,
            stream=True,
        )
        try:
            for line in resp:
                if self._stop.is_set():
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            resp.release_conn()

    def _request(self, query: Obj, *, timeout: float, stream: bool = False) -> Any:
        host = self._client.configuration.host.rstrip("/")
        url = f"{host}{self._path}?{urllib.parse.urlencode(query)}"
        headers = dict(self._client.default_headers)
        self._client.configuration.auth_settings()  # token refresh, as the client does
        if self._client.configuration.api_key.get("authorization"):
            headers["Authorization"] = self._client.configuration.api_key["authorization"]
        return self._client.rest_client.pool_manager.request(
            "GET", url, headers=headers, preload_content=not stream, timeout=timeout
        )


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _rv(obj: Obj) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class _Cycle:
    """One scheduling cycle's view (SchedulerSim's ``Snapshot``): the informers' caches."""

    def __init__(self, owner: ClusterScheduler) -> None:
        self._owner = owner
        self._by_node: dict[str, tuple[int, list[Obj]]] = {}  # read once per node and cycle
        self._extra: dict[str, list[Obj]] = {}

    def node(self, node_name: str) -> _Node:
        return self._owner.node_devices(node_name)

    def _allocated(self, node_name: str) -> tuple[int, list[Obj]]:
        if node_name not in self._by_node:
            self._by_node[node_name] = self._owner.claims.indexed(node_name)
        return self._by_node[node_name]

    def claims_on(self, node_name: str) -> Iterable[Obj]:
        return [*self._allocated(node_name)[1], *self._extra.get(node_name, [])]

    def claims_key(self, node_name: str) -> tuple[int, int] | None:
        """Changes whenever :meth:`claims_on` may have: the claims index's version for the node
        (None while this cycle planned a claim there: not kept)."""
        if self._extra.get(node_name):
            return None
        return (id(self._owner.claims), self._allocated(node_name)[0])

    def device_class(self, name: str) -> Obj:
        return self._owner.device_class(name)

    def add(self, node_name: str, claim: Obj) -> None:
        """A claim planned on the node this cycle (a pod's next claim sees it)."""
        self._extra.setdefault(node_name, []).append(claim)


ALL_NODES = "\x00all-nodes"
"""The slice index value of ``allNodes`` slices (no node name can be it)."""


def _slice_node(obj: Obj) -> str:
    spec = obj.get("spec") or {}
    return ALL_NODES if spec.get("allNodes") else str(spec.get("nodeName") or "")


def _claim_node(obj: Obj) -> str:
    return _allocated_node((obj.get("status") or {}).get("allocation"))


def _allocated_node(allocation: Obj | None) -> str:
    for term in ((allocation or {}).get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return str(f["values"][0])
    return ""


@dataclass
class Decision:
    """What one scheduling cycle decided (for tests and benches)."""

    pod: str
    node: str
    feasible: int
    scores: dict[str, int] = field(default_factory=dict)
    extender_errors: int = 0


class ClusterScheduler:
    """kube-scheduler's node choice over ``nodes`` for pods with ResourceClaims (see the module docstring).

    **Parameters:**
    * api_client - the official client on the (fake) API server.
    * driver_name - passed to the allocator.
    * nodes - node names in the cluster (their Node objects are read once, for allocatable).
    * extenders - ``ExtenderSpec`` per configured extender.
    * seed - the tie-break's random seed.
    """

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        driver_name: str,
        *,
        nodes: list[str],
        extenders: Iterable[ExtenderSpec] = (),
        seed: int = 1,
    ) -> None:
        self.sim = SchedulerSim(api_client, driver_name)
        self.api_client = api_client
        self.nodes = list(nodes)
        self.extenders = [ExtenderClient(e) for e in extenders]
        self.slices = Informer(api_client, f"{RESOURCE}/resourceslices", index=_slice_node)
        self.claims = Informer(api_client, f"{RESOURCE}/resourceclaims", index=_claim_node)
        self._random = random.Random(seed)  # noqa: S311 - a tie-break, not crypto
        self._classes: dict[str, Obj] = {}
        self._node_cache: dict[str, tuple[tuple[int, int], _Node]] = {}
        self._node_objs: dict[str, Obj] = {}
        self._allocatables: dict[str, tuple[int, int]] = {}
        self.pods_on: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.bound: dict[str, str] = {}
        self.decisions: list[Decision] = []
        self._lock = threading.Lock()

    def start(self) -> ClusterScheduler:
        core = kubernetes.client.CoreV1Api(self.api_client)
        for name in self.nodes:
            try:
                self._node_objs[name] = self.sim._to_dict(core.read_node(name))
            except ApiException:
                self._node_objs[name] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        self.slices.start()
        self.claims.start()
        return self

    def stop(self) -> None:
        self.slices.stop()
        self.claims.stop()

    def __enter__(self) -> ClusterScheduler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- caches

    def device_class(self, name: str) -> Obj:
        if name not in self._classes:
            self._classes[name] = self.sim._device_class(name)
        return self._classes[name]

    def node_devices(self, node_name: str) -> _Node:
        """The node's candidates, rebuilt only when one of its slices (or an all-nodes slice) changed."""
        cached = self._node_cache.get(node_name)
        mine_version, all_version = self.slices.index_version(node_name), self.slices.index_version(ALL_NODES)
        if cached is None or cached[0] != (mine_version, all_version):
            mine_version, mine = self.slices.indexed(node_name)
            all_version, shared = self.slices.indexed(ALL_NODES)
            cached = ((mine_version, all_version), node_from_slices([*mine, *shared], node_name))
            self._node_cache[node_name] = cached
        return cached[1]

    # ---- one cycle

    def schedule(self, pod: Obj) -> str:
        """Choose a node for ``pod``, allocate its claims there and bind it; raises Unschedulable."""
        with self._lock:
            return self._schedule(pod)

    def _schedule(self, pod: Obj) -> str:
        meta = pod["metadata"]
        claims = [self._claim(meta["namespace"], ref) for ref in self._claim_names(pod)]
        cycle = _Cycle(self)
        plans: dict[str, list[Obj]] = {}
        reasons: list[str] = []
        pinned = ((pod.get("spec") or {}).get("nodeSelector") or {}).get("kubernetes.io/hostname")
        for node in self.nodes:
            if pinned and node != pinned:
                continue  # NodeAffinity's filter (the hostname label equals the node name here)
            planned = self._filter(cycle, node, claims, reasons)
            if planned is not None:
                plans[node] = planned
        if not plans:
            raise Unschedulable(
                meta["namespace"], meta["name"], f"0/{len(self.nodes)} nodes are available: {reasons[-1:]}"
            )
        feasible = [n for n in self.nodes if n in plans]
        decision = Decision(pod=meta["name"], node="", feasible=len(feasible))
        if len(feasible) == 1:
            chosen = feasible[0]
        else:
            totals = {n: self._default_score(n) for n in feasible}
            for ext in self.extenders:
                if not ext.interested(pod):
                    continue
                try:
                    answer = ext.prioritize(pod, [self._node_objs[n] for n in feasible])
                except Exception:  # kube-scheduler ignores any prioritize failure
                    decision.extender_errors += 1
                    continue
                for host, score in answer.items():
                    if host in totals:
                        totals[host] += score * ext.spec.weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
            decision.scores = totals
            best = max(totals.values())
            chosen = self._random.choice([n for n in feasible if totals[n] == best])
        ref = {"resource": "pods", "name": meta["name"], "uid": meta.get("uid", meta["name"])}
        for claim, allocation in zip(claims, plans[chosen], strict=True):
            if (claim.get("status") or {}).get("allocation"):
                stored = self.sim.allocate(
                    meta["namespace"], claim["metadata"]["name"], chosen, reserved_for=[ref]
                )
            else:
                stored = self.sim.commit(claim, allocation, reserved_for=[ref])
            self.claims.assume(stored)
        self.pods_on[chosen] = self.pods_on.get(chosen, 0) + 1
        self.bound[f"{meta['namespace']}/{meta['name']}"] = chosen
        decision.node = chosen
        self.decisions.append(decision)
        return chosen

    def _filter(self, cycle: _Cycle, node: str, claims: list[Obj], reasons: list[str]) -> list[Obj] | None:
        planned: list[Obj] = []
        for claim in claims:
            allocation = (claim.get("status") or {}).get("allocation")
            if allocation:
                if _allocated_node(allocation) != node:
                    return None
                planned.append(allocation)
                continue
            try:
                allocation = self.sim.plan_on(claim, node, snapshot=cycle)
            except Unschedulable as err:
                reasons.append(f"{node}: {err.reason}")
                return None
            planned.append(allocation)
            cycle.add(node, {**claim, "status": {"allocation": allocation}})
        return planned

    def _claim(self, namespace: str, name: str) -> Obj:
        cached = self.claims.get(f"{namespace}/{name}")
        if cached is not None:
            return cached
        return self.sim._read_claim(namespace, name)  # created a moment ago: not in the cache yet

    @staticmethod
    def _claim_names(pod: Obj) -> list[str]:
        return [
            str(rc["resourceClaimName"])
            for rc in (pod.get("spec") or {}).get("resourceClaims") or []
            if rc.get("resourceClaimName")
        ]

    def _default_score(self, node: str) -> int:
        """NodeResourcesFit LeastAllocated + BalancedAllocation (CPU, memory), non-zero pod requests."""
        cpu_cap, mem_cap = self._allocatable(node)
        pods = self.pods_on.get(node, 0) + 1  # with the pod being scheduled
        cpu_req, mem_req = pods * NONZERO_CPU_MILLI, pods * NONZERO_MEMORY
        least = (
            max(0, cpu_cap - cpu_req) * MAX_NODE_SCORE // cpu_cap
            + max(0, mem_cap - mem_req) * MAX_NODE_SCORE // mem_cap
        ) // 2
        fractions = (min(1.0, cpu_req / cpu_cap), min(1.0, mem_req / mem_cap))
        std = abs(fractions[0] - fractions[1]) / 2
        balanced = int((1 - std) * MAX_NODE_SCORE)
        return least + balanced

    def _allocatable(self, node: str) -> tuple[int, int]:
        """The node's allocatable CPU (milli) and memory (bytes), parsed once (a NodeInfo's)."""
        if node in self._allocatables:
            return self._allocatables[node]
        alloc = (self._node_objs[node].get("status") or {}).get("allocatable") or DEFAULT_ALLOCATABLE
        cpu_cap = int(parse_quantity(str(alloc.get("cpu", DEFAULT_ALLOCATABLE["cpu"])))[0] * 1000)
        mem_cap = int(parse_quantity(str(alloc.get("memory", DEFAULT_ALLOCATABLE["memory"])))[0])
        self._allocatables[node] = (cpu_cap, mem_cap)
        return cpu_cap, mem_cap

    # ---- a queue

    def run(
        self,
        arrivals: Iterable[tuple[float, Obj]],
        *,
        backoff: float = 1.0,
        deadline: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> dict[str, str]:
        """Schedule pods as they arrive (``(seconds after start, pod)``); an unschedulable pod is
        tried again every ``backoff`` seconds until ``deadline``. Returns pod -> node of the bound ones."""
        start = clock()
        pending: list[tuple[float, Obj]] = sorted(arrivals, key=lambda a: a[0])
        while pending and clock() - start < deadline:
            at, pod = pending[0]
            wait = start + at - clock()
            if wait > 0:
                time.sleep(min(wait, 0.05))  # the arrival clock of a bench, not a synchronisation
                continue
            pending.pop(0)
            try:
                self.schedule(pod)
            except Unschedulable:
                pending.append((clock() - start + backoff, pod))
                pending.sort(key=lambda a: a[0])
        return dict(self.bound)
