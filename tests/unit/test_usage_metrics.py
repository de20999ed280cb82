"""The usage collector on its own: unknowns are left out, pods are cached per claim, a silent daemon says so."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver import usage_metrics
from dra_driver.daemon_api.values import Endpoints, EntityInfo, EntityState, ShareUsage
from dra_driver.devices import Die, Inventory
from dra_driver.errors import ErrorCode, Unavailable
from flexnpu_wire.shares import Share

MI = 1024 * 1024


def die(phy: int) -> Die:
    return Die(
        vdie_id=f"VD{phy}", model="910B4", card_id=phy, chip_id=0, phy_id=phy, logic_id=phy,
        pci_bus_id=f"0000:0{phy}:00.0", numa_node=0, memory_mib=32768, aicore=20, aicpu=7,
    )  # fmt: skip


def entity(uid: str, *, used: int, state: EntityState = EntityState.RUNNING, restarts: int = 0) -> EntityInfo:
    share = Share(virtual_id=0, die_phy_id=1, memory_bytes=512 * MI, compute_percent=30, policy="fixed")
    return EntityInfo(
        entity_id=uid, namespace="ns", name=f"claim-{uid}", shares=(ShareUsage(share, memory_used_bytes=used, compute_used_us=used // 1024, sessions=2 if used >= 0 else -1),),
        pid=10, state=state, endpoints=Endpoints(), restarts=restarts,
    )  # fmt: skip


class Daemon:
    def __init__(self, entities: list[EntityInfo]) -> None:
        self.entities = entities
        self.down = False

    def list(self, *, probe: bool = False) -> list[EntityInfo]:
        if self.down:
            raise Unavailable("daemon down", code=ErrorCode.DAEMON_UNAVAILABLE)
        return self.entities


class Kube:
    def __init__(self) -> None:
        self.calls = 0

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.calls += 1
        uid = name.removeprefix("claim-")
        return {
            "metadata": {"uid": uid},
            "status": {"reservedFor": [{"resource": "pods", "name": f"pod-{uid}"}]},
        }


def scrape(registry: CollectorRegistry) -> list[Any]:
    text = generate_latest(registry).decode()
    return [smp for fam in text_string_to_metric_families(text) for smp in fam.samples]


def value(samples: list[Any], name: str, **labels: str) -> float | None:
    found = [smp.value for smp in samples if smp.name == name and labels.items() <= smp.labels.items()]
    assert len(found) <= 1, found
    return float(found[0]) if found else None


def test_series_pods_cache_and_daemon_down() -> None:
    daemon = Daemon([entity("a", used=64 * MI), entity("b", used=-1, state=EntityState.EXITED, restarts=2)])
    kube, now = Kube(), [0.0]
    collector = usage_metrics.VnpuUsageCollector(
        daemon=daemon, kube=kube, inventory=lambda: Inventory(dies=(die(0), die(1))),
        node_name="n1", driver_name="npu.flexnpu.io", max_shares_per_die=63, clock=lambda: now[0],
    )  # fmt: skip
    registry = CollectorRegistry()
    registry.register(collector)
    got = scrape(registry)
    a = {"node": "n1", "driver": "npu.flexnpu.io", "namespace": "ns", "pod": "pod-a", "claim": "claim-a"}
    vnpu_a = {**a, "die": "1", "vdie_id": "VD1", "v_dev_id": "0"}
    assert value(got, "flexnpu_vnpu_pod_used_memory_bytes", **vnpu_a) == 64 * MI
    assert value(got, "flexnpu_vnpu_pod_total_memory_bytes", **vnpu_a) == 512 * MI
    assert value(got, "flexnpu_vnpu_pod_compute_quota_percent", **vnpu_a) == 30
    assert value(got, "flexnpu_vnpu_pod_sessions", **vnpu_a) == 2
    assert value(got, "flexnpu_vnpu_pod_compute_seconds_total", **vnpu_a) == 64 * MI // 1024 / 1e6
    assert value(got, "flexnpu_vnpu_pod_used_memory_bytes", claim="claim-b") is None  # unknown: left out
    assert value(got, "flexnpu_vnpu_pod_sessions", claim="claim-b") is None
    assert value(got, "flexnpu_vnpu_pod_compute_seconds_total", claim="claim-b") is None
    assert value(got, "flexnpu_aclserver_up", pod="pod-a") == 1
    assert value(got, "flexnpu_aclserver_up", pod="pod-b") == 0
    assert value(got, "flexnpu_aclserver_restarts_total", pod="pod-b") == 2
    assert value(got, "flexnpu_die_shares", die="1", vdie_id="VD1") == 2
    assert value(got, "flexnpu_die_compute_allocated_percent", die="1") == 60
    assert value(got, "flexnpu_die_memory_total_bytes", die="0") == 32768 * MI
    assert value(got, "flexnpu_die_share_limit", die="0") == 63
    assert value(got, "flexnpu_vnpu_collect_ok") == 1
    assert kube.calls == 2
    scrape(registry)
    assert kube.calls == 2  # cached
    now[0] += usage_metrics.POD_CACHE_SECONDS + 1
    scrape(registry)
    assert kube.calls == 4  # re-read after the cache time
    daemon.down = True
    got = scrape(registry)
    assert value(got, "flexnpu_vnpu_collect_ok") == 0
    assert not [smp for smp in got if smp.name.startswith("flexnpu_vnpu_pod_")]
    assert value(got, "flexnpu_die_shares", die="1") == 0


def test_pods_from_claim_keeps_only_pods() -> None:
    claim = {
        "status": {"reservedFor": [{"resource": "pods", "name": "p1"}, {"resource": "jobs", "name": "j"}]}
    }
    assert usage_metrics.pods_from_claim(claim) == ("p1",)
    assert usage_metrics.pods_from_claim({}) == ()


def test_a_claim_with_sixteen_vnpus_takes_one_slot_of_the_share_limit() -> None:
    one = entity("a", used=0)
    vnpus = tuple(
        ShareUsage(
            Share(virtual_id=i, die_phy_id=1, memory_bytes=128 * MI, compute_percent=1, policy="fixed")
        )
        for i in range(16)
    )
    many = EntityInfo(
        entity_id="b", namespace="ns", name="claim-b", shares=vnpus, pid=11, state=EntityState.RUNNING,
        endpoints=Endpoints(),
    )  # fmt: skip
    collector = usage_metrics.VnpuUsageCollector(
        daemon=Daemon([one, many]), kube=Kube(), inventory=lambda: Inventory(dies=(die(1),)),
        node_name="n1", driver_name="npu.flexnpu.io", max_shares_per_die=63,
    )  # fmt: skip
    registry = CollectorRegistry()
    registry.register(collector)
    got = scrape(registry)
    assert value(got, "flexnpu_die_shares", die="1") == 2  # two aclservers, as the ledger counts them
    assert value(got, "flexnpu_die_compute_allocated_percent", die="1") == 30 + 16


class _Entry:
    """A ledger entry as the collector reads it (``flexnpu_runtime.aclserver.ledger.LedgerEntry``)."""

    def __init__(
        self, uid: str, priority: str, consumed_us: int, buckets: tuple[int, ...], preempted: int
    ) -> None:
        self.claim_uid, self.virtual_id, self.consumed_us, self.kernels = uid, 0, consumed_us, 7
        self.priority, self.preempted, self.delay_buckets = priority, preempted, buckets
        self.delay_sum_us = 1500


def test_queueing_delay_preemptions_and_die_time_by_priority() -> None:
    from flexnpu_runtime.aclserver import ledger

    assert usage_metrics.DELAY_BUCKETS_S == ledger.DELAY_BUCKETS_S, "the collector's buckets are the ledger's"
    n = len(ledger.DELAY_BUCKETS_S) + 1
    lc = _Entry("a", "latency-critical", 2_000_000, (5, 3, *([0] * (n - 3)), 2), 0)
    batch = _Entry("b", "batch", 3_000_000, (0,) * n, 11)
    collector = usage_metrics.VnpuUsageCollector(
        daemon=Daemon([entity("a", used=0), entity("b", used=0)]), kube=Kube(),
        inventory=lambda: Inventory(dies=(die(1),)), node_name="n1", driver_name="npu.flexnpu.io",
        max_shares_per_die=63, ledger=lambda _die: [lc, batch], delay_bound_seconds=0.0015,
    )  # fmt: skip
    registry = CollectorRegistry()
    registry.register(collector)
    got = scrape(registry)
    name = "flexnpu_vnpu_pod_queue_delay_seconds"
    lc_labels = {"claim": "claim-a", "priority": "latency-critical"}
    assert value(got, f"{name}_bucket", le="0.0001", **lc_labels) == 5
    assert value(got, f"{name}_bucket", le="0.00025", **lc_labels) == 8, "cumulative"
    assert value(got, f"{name}_bucket", le="+Inf", **lc_labels) == 10
    assert value(got, f"{name}_count", **lc_labels) == 10 and value(got, f"{name}_sum", **lc_labels) == 0.0015
    assert value(got, "flexnpu_vnpu_pod_queue_delay_bound_seconds", **lc_labels) == 0.0015
    assert value(got, "flexnpu_vnpu_pod_slices_preempted_total", claim="claim-b", priority="batch") == 11
    die_time = "flexnpu_die_priority_compute_seconds_total"
    assert value(got, die_time, die="1", priority="latency-critical") == 2.0
    assert value(got, die_time, die="1", priority="batch") == 3.0
