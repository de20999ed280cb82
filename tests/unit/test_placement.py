"""The placement order (dra_driver/placement.py): tables of usage -> device order, layout, node scores."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path

import pytest

from dra_driver import discovery, placement, slices
from dra_driver.devices import DieMode, Inventory
from dra_driver.errors import InvalidInput
from dra_driver.placement import Allocated, DieUse, Placement
from dra_kubeletplugin.resourceslice import pools

REPO = Path(__file__).resolve().parents[2]
EIGHT = REPO / "flexnpu_testing" / "inventories" / "eight-910b4.yaml"


def inventory() -> Inventory:
    return discovery.from_config(inventory=EIGHT, npu_smi="npu-smi").discover()


def pool(mode: DieMode = DieMode.BOTH) -> slices.DesiredPool:
    return slices.build_pool(inventory(), driver_name="d", node_name="n", mode_of=lambda _d: mode)


def share(die: int, compute: int = 25, memory: str = "256Mi", policy: str = "") -> Allocated:
    name = f"vnpu-{die}" + (f"-{policy}" if policy else "")
    return Allocated(
        pool="n", device=name, consumed={"compute": str(compute), "memory": memory, "shares": "1"}
    )


def elastic_dies(p: slices.DesiredPool) -> list[int]:
    """Dies in the order their elastic share device is listed."""
    names = [n for n in p.device_names if n.startswith("vnpu-") and n.count("-") == 1]
    return [int(n.split("-")[1]) for n in names]


def whole_dies(p: slices.DesiredPool) -> list[int]:
    return [int(n.split("-")[1]) for n in p.device_names if n.startswith("npu-") and n.count("-") == 1]


def ordered(results: list[Allocated], policy: Placement, mode: DieMode = DieMode.BOTH) -> slices.DesiredPool:
    p = pool(mode)
    usage = placement.die_usage(results, placement.device_infos(p))
    return placement.order_pool(p, usage, policy)


@pytest.mark.parametrize(
    ("results", "policy", "expected"),
    [
        pytest.param([], Placement.BINPACK, [7, 6, 5, 4, 3, 2, 1, 0], id="empty-binpack-highest-die-first"),
        pytest.param([], Placement.SPREAD, [7, 6, 5, 4, 3, 2, 1, 0], id="empty-spread-same-tie-break"),
        pytest.param(
            [share(2), share(5), share(5)], Placement.BINPACK, [5, 2, 7, 6, 4, 3, 1, 0], id="binpack-most-used-first"
        ),
        pytest.param(
            [share(2), share(5), share(5)], Placement.SPREAD, [7, 6, 4, 3, 1, 0, 2, 5], id="spread-least-used-first"
        ),
        pytest.param(
            [share(3, 100), share(6, 50)], Placement.BINPACK, [6, 7, 5, 4, 2, 1, 0, 3], id="binpack-full-die-last"
        ),
        pytest.param(
            [share(1, 10, "30Gi"), share(4, 50)], Placement.BINPACK, [1, 4, 7, 6, 5, 3, 2, 0],
            id="memory-counts-as-much-as-compute",
        ),
        pytest.param(
            [Allocated("n", "npu-6")], Placement.BINPACK, [7, 6, 5, 4, 3, 2, 1, 0],
            id="a-whole-die-does-not-reorder-shares",
        ),
        pytest.param(
            [share(0, 25, policy="fixed")], Placement.BINPACK, [0, 7, 6, 5, 4, 3, 2, 1],
            id="any-policy-share-counts-for-its-die",
        ),
    ],
)  # fmt: skip
def test_share_order(results: list[Allocated], policy: Placement, expected: list[int]) -> None:
    assert elastic_dies(ordered(results, policy)) == expected


def test_a_dies_share_devices_keep_their_policy_order() -> None:
    p = ordered([share(3)], Placement.BINPACK)
    names = [n for n in p.device_names if n.startswith("vnpu-")]
    assert names[:3] == ["vnpu-3", "vnpu-3-fixed", "vnpu-3-best-effort"]


@pytest.mark.parametrize("policy", list(Placement))
def test_whole_devices_stay_ascending_whatever_is_allocated(policy: Placement) -> None:
    empty = ordered([], policy, DieMode.ALL)
    used = [share(0), Allocated("n", "npu-2"), Allocated("n", "npu-3-vir05-1c-8g-0")]
    p = ordered(used, policy, DieMode.ALL)
    assert whole_dies(p) == whole_dies(empty) == list(range(8))
    assert p.device_names[:8] == [f"npu-{d}" for d in whole_dies(p)]  # whole devices stay first
    # so a whole allocation alone changes no slice: nothing to republish
    assert ordered([Allocated("n", "npu-2")], policy, DieMode.ALL).slices == empty.slices


def test_no_device_changes_slice() -> None:
    p = pool(DieMode.ALL)
    before = [{d["name"] for d in s.get("devices", [])} for s in p.slices]
    results = [share(1), Allocated("n", "npu-3-vir05-1c-8g-0"), Allocated("n", "npu-5")]
    for policy in Placement:
        after = placement.order_pool(p, placement.die_usage(results, placement.device_infos(p)), policy)
        assert [{d["name"] for d in s.get("devices", [])} for s in after.slices] == before
        assert [s.get("sharedCounters") for s in after.slices] == [s.get("sharedCounters") for s in p.slices]
        pools.validate(after)


def test_layout_keeps_a_template_in_one_slice() -> None:
    p = pool(DieMode.ALL)
    where: dict[str, set[int]] = {}
    for i, s in enumerate(p.slices):
        for d in s.get("devices", []):
            t = (d["attributes"].get("template") or {}).get("string")
            if t:
                where.setdefault(t, set()).add(i)
    assert where and all(len(v) == 1 for v in where.values()), where
    assert len(p.device_names) == 128


@pytest.mark.parametrize(
    ("policy", "expected_first_dies"),
    [
        pytest.param(Placement.BINPACK, [4, 4, 4, 4, 7, 7, 7, 7], id="binpack-fills-the-used-die"),
        pytest.param(Placement.SPREAD, [7, 6, 5, 3, 2, 1, 0, 4], id="spread-one-per-die"),
    ],
)
def test_template_order(policy: Placement, expected_first_dies: list[int]) -> None:
    p = ordered([Allocated("n", "npu-4-vir05-1c-8g-0")], policy, DieMode.ALL)
    names = [n for n in p.device_names if "-vir05-1c-8g-" in n]
    assert [int(n.split("-")[1]) for n in names[:: 4 if policy is Placement.SPREAD else 1]][:8] == (
        expected_first_dies
    )


def test_a_template_on_a_die_does_not_reorder_shares() -> None:
    base = elastic_dies(ordered([], Placement.BINPACK, DieMode.ALL))
    assert (
        elastic_dies(ordered([Allocated("n", "npu-2-vir05-1c-8g-0")], Placement.BINPACK, DieMode.ALL)) == base
    )


def test_allocated_results_filter_driver_and_pool() -> None:
    claims = [
        {"status": {"allocation": {"devices": {"results": [
            {"driver": "d", "pool": "n", "device": "vnpu-1", "consumedCapacity": {"compute": "25"}},
            {"driver": "other", "pool": "n", "device": "gpu-0"},
            {"driver": "d", "pool": "m", "device": "vnpu-2"},
            {"driver": "d", "pool": "n", "device": "npu-3", "adminAccess": True},
        ]}}}},
        {"status": {}},
        {},
    ]  # fmt: skip
    assert placement.allocated_results(claims, driver="d", pool="n") == [
        Allocated("n", "vnpu-1", {"compute": "25"})
    ]
    assert len(placement.allocated_results(claims, driver="d")) == 2


@pytest.mark.parametrize(
    ("usage", "binpack", "spread"),
    [
        pytest.param({}, 0, 10, id="empty"),
        pytest.param({7: DieUse(shares=1, compute=Fraction(25))}, 1, 9, id="one-share"),
        pytest.param({d: DieUse(whole=True) for d in range(8)}, 10, 0, id="full"),
        pytest.param({d: DieUse(whole=True) for d in range(4)}, 5, 5, id="half-whole"),
    ],
)
def test_node_score(usage: Mapping[int, DieUse], binpack: int, spread: int) -> None:
    totals = placement.die_totals(pool())
    fill = placement.node_fill(totals, usage)
    assert placement.node_score(fill, Placement.BINPACK) == binpack
    assert placement.node_score(fill, Placement.SPREAD) == spread


def test_node_fill_counts_partly_used_dies() -> None:
    totals = placement.die_totals(pool())
    usage = {
        0: DieUse(whole=True),
        1: DieUse(shares=1, compute=Fraction(25)),
        2: DieUse(shares=4, compute=Fraction(100)),
    }
    fill = placement.node_fill(totals, usage)
    assert (fill.dies, fill.dies_in_use, fill.dies_partly_used) == (8, 3, 1)
    assert fill.compute == Fraction(9, 32)


@pytest.mark.parametrize("value", ["Binpack", " spread "])
def test_policy_parse(value: str) -> None:
    assert Placement.parse(value) in Placement


def test_policy_parse_names_the_field() -> None:
    with pytest.raises(InvalidInput) as err:
        Placement.parse("pack", field="placement")
    assert err.value.field == "placement" and "'pack'" in str(err.value)


def _claim(uid: str, *results: tuple[str, str, str]) -> dict[str, object]:
    return {
        "metadata": {"uid": uid, "namespace": "ns", "name": uid},
        "status": {"allocation": {"devices": {"results": [
            {"driver": drv, "pool": pool, "device": dev, "request": "r"} for drv, pool, dev in results
        ]}}} if results else {},
    }  # fmt: skip


def test_claim_cache_tracks_allocations_and_names_the_changed_pools() -> None:
    from controller.allocations import ClaimAllocations

    seen: list[frozenset[str]] = []
    cache = ClaimAllocations(None, driver="d", on_change=seen.append)  # type: ignore[arg-type]  # no API: events by hand
    cache.reset([_claim("a", ("d", "n1", "vnpu-1")), _claim("b")])
    assert seen == [frozenset({"n1"})] and [r.device for r in cache.results("n1")] == ["vnpu-1"]
    cache.apply("MODIFIED", _claim("b", ("d", "n2", "npu-0"), ("other", "n2", "gpu-0")))
    assert seen[-1] == frozenset({"n2"}) and [r.device for r in cache.results("n2")] == ["npu-0"]
    cache.apply("MODIFIED", _claim("b", ("d", "n2", "npu-0")))  # a status write that changes nothing here
    assert len(seen) == 2
    cache.apply(
        "MODIFIED", _claim("a", ("d", "n2", "vnpu-3"))
    )  # moved pools (deallocated and allocated again)
    assert seen[-1] == frozenset({"n1", "n2"}) and cache.results("n1") == []
    cache.apply("DELETED", _claim("b", ("d", "n2", "npu-0")))
    assert [r.device for r in cache.results("n2")] == ["vnpu-3"] and cache.pools() == ["n2"]


def test_claim_cache_of_one_pool_ignores_the_others() -> None:
    from controller.allocations import ClaimAllocations

    seen: list[frozenset[str]] = []
    cache = ClaimAllocations(None, driver="d", pool="n1", on_change=seen.append)  # type: ignore[arg-type]
    cache.apply("ADDED", _claim("x", ("d", "n2", "vnpu-1")))
    assert seen == [] and cache.results("n2") == []


def _line(kind: str, claim: Mapping[str, object], *, compact: bool = False) -> bytes:
    """A watch event line as an API server writes it (Go's compact JSON, or with spaces)."""
    separators = (",", ":") if compact else (", ", ": ")
    return json.dumps({"type": kind, "object": claim}, separators=separators).encode() + b"\n"


@pytest.mark.parametrize(
    ("line", "unrelated"),
    [
        pytest.param(_line("ADDED", _claim("new")), True, id="an-unallocated-claim"),
        pytest.param(_line("MODIFIED", _claim("b", ("d", "n2", "npu-0"))), True, id="allocated-on-another-pool"),
        pytest.param(_line("MODIFIED", _claim("b", ("d", "n2", "npu-0")), compact=True), True, id="compact-json"),
        pytest.param(_line("MODIFIED", _claim("b", ("d", "n1", "npu-0"))), False, id="allocated-on-this-pool"),
        pytest.param(_line("MODIFIED", _claim("b", ("d", "n1", "npu-0")), compact=True), False,
                     id="allocated-on-this-pool-compact"),
        pytest.param(_line("MODIFIED", _claim("b", ("other", "n1", "gpu-0"))), False,
                     id="this-pool-of-another-driver-is-decoded-too"),
        pytest.param(_line("MODIFIED", _claim("a")), False, id="a-counted-claim-de-allocated"),
        pytest.param(_line("DELETED", _claim("a", ("d", "n1", "vnpu-1"))), False, id="a-counted-claim-deleted"),
        pytest.param(_line("MODIFIED", _claim("b", ("d", "n1", "npu-0"))).replace(b'"n1"', b'"n\\u0031"'), False,
                     id="this-pool-spelled-with-an-escape"),
        pytest.param(_line("MODIFIED", _claim("b", ("d", "n2/x", "npu-0"))).replace(b"/", b"\\/"), False,
                     id="an-escaped-solidus-is-a-doubt"),
        pytest.param(_line("BOOKMARK", {"metadata": {"resourceVersion": "9"}}), False, id="a-bookmark"),
        pytest.param(_line("ERROR", {"kind": "Status", "code": 410}), False, id="an-error-event"),
        pytest.param(_line("ADDED", _claim("n1")), False, id="anything-spelling-the-pool-name"),
    ],
)  # fmt: skip
def test_claim_cache_of_one_pool_knows_unrelated_lines_undecoded(line: bytes, unrelated: bool) -> None:
    from controller.allocations import ClaimAllocations

    cache = ClaimAllocations(None, driver="d", pool="n1")  # type: ignore[arg-type]
    cache.reset([_claim("a", ("d", "n1", "vnpu-1"))])  # counted here
    assert cache.unrelated(line) is unrelated
    assert cache.skipped == int(unrelated)


def test_claim_cache_takes_no_line_as_unrelated_with_a_claim_it_cannot_spell() -> None:
    from controller.allocations import ClaimAllocations

    cache = ClaimAllocations(None, driver="d", pool="n1")  # type: ignore[arg-type]
    no_uid = {
        "metadata": {"namespace": "ns"},
        **{k: v for k, v in _claim("a", ("d", "n1", "x")).items() if k != "metadata"},
    }
    cache.apply("ADDED", no_uid)  # counted under "ns/", which no line spells
    assert [r.device for r in cache.results("n1")] == ["x"]
    assert not cache.unrelated(_line("ADDED", _claim("new")))
    assert ClaimAllocations(None, driver="d").unrelated(_line("ADDED", _claim("new"))) is False  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(6))
def test_dropping_unrelated_lines_changes_nothing_the_cache_tells(seed: int) -> None:
    """Random claim events on two pools: a cache that drops what ``unrelated`` says holds and tells
    (``on_change``) exactly what a cache that decodes every event does, after each event."""
    from controller.allocations import ClaimAllocations

    rng = random.Random(seed)
    told: dict[str, list[frozenset[str]]] = {"all": [], "dropping": []}
    every = ClaimAllocations(None, driver="d", pool="n1", on_change=told["all"].append)  # type: ignore[arg-type]
    dropping = ClaimAllocations(None, driver="d", pool="n1", on_change=told["dropping"].append)  # type: ignore[arg-type]
    uids = [f"c{i}" for i in range(6)]
    for _ in range(300):
        uid = rng.choice(uids)
        results = [(rng.choice(["d", "other"]), rng.choice(["n1", "n2"]), f"dev-{rng.randrange(3)}")
                   for _ in range(rng.choice([0, 0, 1, 2]))]  # fmt: skip
        kind = rng.choice(["ADDED", "MODIFIED", "MODIFIED", "DELETED"])
        line = _line(kind, _claim(uid, *results), compact=rng.random() < 0.5)
        event = json.loads(line)
        every.apply(event["type"], event["object"])
        if not dropping.unrelated(line):
            dropping.apply(event["type"], event["object"])
        assert dropping.results("n1") == every.results("n1")
        assert told["dropping"] == told["all"]
    assert dropping.skipped > 50 and dropping.events + dropping.skipped == every.events


# --- first-fit equivalence: which devices no claim can get now ------------------------------------

T8 = "vir05-1c-8g"  # 5 AI Cores, 4 instances a die of 20


def template(die: int, i: int, name: str = T8) -> Allocated:
    return Allocated("n", f"npu-{die}-{name}-{i}")


def die_devices(p: slices.DesiredPool, die: int) -> set[str]:
    return {n for n in p.device_names if n.split("-")[1] == str(die)}


@pytest.mark.parametrize(
    ("results", "unfit_on_die_7"),
    [
        pytest.param([], set(), id="empty-node-all-fit"),
        pytest.param(
            [Allocated("n", "npu-7")], "all", id="held-whole-the-die-takes-nothing-more"
        ),
        pytest.param(
            [share(7)],
            {"npu-7", "vnpu-7-fixed", "vnpu-7-best-effort"} | {f"npu-7-{t}" for t in (
                "vir05-1c-8g-0", "vir05-1c-8g-1", "vir05-1c-8g-2", "vir05-1c-8g-3", "vir05-1c-16g-0",
                "vir05-1c-16g-1", "vir10-3c-16g-0", "vir10-3c-16g-1", "vir10-3c-16g-nm-0",
                "vir10-3c-16g-nm-1", "vir10-4c-16g-m-0", "vir10-3c-32g-0")},
            id="a-share-keeps-the-whole-device-other-policies-and-templates-off",
        ),
        pytest.param(
            [share(7, 100)], "all", id="a-share-device-at-full-compute-takes-no-share-either"
        ),
        pytest.param(
            [template(7, 0)],
            {"npu-7", "vnpu-7", "vnpu-7-fixed", "vnpu-7-best-effort", f"npu-7-{T8}-0",
             "npu-7-vir10-3c-32g-0"},  # 32 GiB of the die's 32: no longer there
            id="a-template-keeps-whole-and-shares-off-its-siblings-still-fit",
        ),
        pytest.param(
            [template(7, i) for i in range(4)], "all", id="four-5-core-templates-fill-the-20-cores"
        ),
    ],
)  # fmt: skip
def test_unfit_devices(results: list[Allocated], unfit_on_die_7: set[str] | str) -> None:
    p = pool(DieMode.ALL)
    unfit = placement.unfit_devices(placement.PoolFacts.of(p), results)
    expected = die_devices(p, 7) if unfit_on_die_7 == "all" else unfit_on_die_7
    assert unfit == expected


def test_a_share_device_with_room_left_stays_fit() -> None:
    p = pool(DieMode.ALL)
    unfit = placement.unfit_devices(placement.PoolFacts.of(p), [share(7, 50), share(7, 49)])
    assert "vnpu-7" not in unfit and "vnpu-7-fixed" in unfit


@pytest.mark.parametrize(
    ("results", "policy", "equivalent"),
    [
        pytest.param([share(7, 50), share(7, 50)], Placement.BINPACK, True,
                     id="binpack-full-die-moved-last-same-first-fit"),
        pytest.param([share(7, 100), share(6, 25)], Placement.BINPACK, True,
                     id="binpack-filling-the-next-die-in-static-order"),
        pytest.param([share(7, 25)], Placement.SPREAD, False, id="spread-a-used-die-moved-behind-free-ones"),
        pytest.param([share(3, 25)], Placement.BINPACK, False, id="binpack-a-die-out-of-static-order"),
        pytest.param([share(7, 100), share(6, 50), share(3, 25)], Placement.BINPACK, False,
                     id="binpack-a-fuller-die-not-first"),
        pytest.param([template(7, i) for i in range(4)], Placement.BINPACK, True,
                     id="binpack-templates-a-full-die-moved-last"),
        pytest.param([template(7, 0)], Placement.SPREAD, False, id="spread-templates"),
    ],
)  # fmt: skip
def test_first_fit_view_against_the_static_order(
    results: list[Allocated], policy: Placement, equivalent: bool
) -> None:
    built = pool(DieMode.ALL)
    facts = placement.PoolFacts.of(built)
    static = placement.order_pool(built, {}, policy, facts)  # the empty node's order, published at start
    wanted = placement.order_pool(built, placement.die_usage(results, facts.infos), policy, facts)
    unfit = placement.unfit_devices(facts, results)
    assert wanted.device_names != static.device_names  # the policy would reorder ...
    assert (placement.first_fit_view(wanted, unfit) == placement.first_fit_view(static, unfit)) is equivalent


# --- the fast order and fit against their definitions, on random usage ---------------------------


def _random_results(rng: random.Random, p: pools.Pool) -> list[Allocated]:
    names = [*p.device_names, "not-in-the-pool"]
    out = []
    for _ in range(rng.randrange(12)):
        name = rng.choice(names)
        consumed = {
            "compute": str(rng.choice([10, 25, 50])),
            "memory": rng.choice(["256Mi", "8Gi"]),
            "shares": "1",
        }
        out.append(Allocated("n", name, consumed if name.startswith("vnpu-") else {}))
    return out


def _by_definition(p: pools.Pool, usage: Mapping[int, DieUse], policy: Placement) -> list[list[str]]:
    """Each slice stably sorted by (kind, die key, template); devices the pool does not know last."""
    infos, totals = placement.device_infos(p), placement.die_totals(p)
    rank = {placement.Kind.WHOLE: 0, placement.Kind.SHARE: 1, placement.Kind.TEMPLATE: 2}

    def key(dev: Mapping[str, object]) -> tuple[object, ...]:
        info = infos.get(str(dev["name"]))
        if info is None:
            return (3,)
        use, tot = usage.get(info.phy, DieUse()), totals.get(info.phy, placement.DieTotals())
        return (rank[info.kind], placement.die_key(info, tot, use, policy), info.template)

    return [[d["name"] for d in sorted(spec.get("devices") or [], key=key)] for spec in p.slices]


def _unfit_by_definition(facts: placement.PoolFacts, results: list[Allocated]) -> set[str]:
    """Allocated exclusive devices; share devices with shares short of a share's least; any other
    device whose counters do not fit in what is left once each allocated device consumed once."""
    allocated = {r.device for r in results}
    available = dict(facts.counters)
    for name in allocated:
        for key, amount in (facts.consumes.get(name) or {}).items():
            if key in available:
                available[key] -= amount
    out = set()
    for name, use in facts.consumes.items():
        if name in allocated:
            if name not in facts.least:
                out.add(name)
            else:
                used = {c: sum(placement._int(r.consumed.get(c, 0)) for r in results if r.device == name)
                        for c in facts.capacity[name]}  # fmt: skip
                if any(v - used[c] < facts.least[name][c] for c, v in facts.capacity[name].items()):
                    out.add(name)
        elif any(key in available and amount > available[key] for key, amount in use.items()):
            out.add(name)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_order_and_fit_match_their_definitions(seed: int) -> None:
    rng = random.Random(seed)
    built = pool(rng.choice([DieMode.ALL, DieMode.BOTH]))
    slices_ = [dict(spec) for spec in built.slices]
    slices_[0]["devices"] = [*slices_[0]["devices"][:3], {"name": "unknown"}, *slices_[0]["devices"][3:]]
    p = pools.Pool(name=built.name, slices=slices_)
    facts = placement.PoolFacts.of(p)
    for _ in range(10):
        results = _random_results(rng, p)
        usage = placement.die_usage(results, facts.infos)
        for policy in Placement:
            want = _by_definition(p, usage, policy)
            assert [
                [d["name"] for d in spec.get("devices") or []]
                for spec in placement.order_pool(p, usage, policy, facts).slices
            ] == want
            assert [
                [d["name"] for d in spec.get("devices") or []]
                for spec in placement.order_pool(p, usage, policy).slices
            ] == want
        assert placement.unfit_devices(facts, results) == _unfit_by_definition(facts, results)
