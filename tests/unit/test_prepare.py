"""Preparer, with in-memory fakes for the daemon, the claim status writer and the checkpoint store.

Each table row makes one recorded step of a prepare or an unprepare raise, and asserts what
remains on the node (checkpoint entry and state, aclserver, client.conf, CDI spec, status) and
what was rolled back. Files are real, under ``tmp_path``; the SIGKILL version of the same
question is ``tests/integration/test_fault_crash.py``.
"""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from dra_driver import cdi, files, wirefiles
from dra_driver import plan as plan_mod
from dra_driver.checkpoint import ClaimState, EffectKind
from dra_driver.daemon_api.values import RegisterRequest, RegisterResult
from dra_driver.devices import Die, Inventory
from dra_driver.errors import InvalidInput, StateError, Unavailable
from dra_kubeletplugin.claims import CALL_DEADLINE, ClaimRef, PrepareResult, ResourceClaim
from flexnpu_testing import devroot
from flexnpu_testing.fakes import FakeDaemon, FakeStatus, FakeStore
from kubeletplugin.prepare import Preparer, PrepareSettings

DRIVER = "npu.flexnpu.io"
POOL = "node1"
KIND = cdi.Kind.parse("flexnpu.io/vnpu")
MIB = 1024 * 1024


class Boom(Exception):
    """An exception the driver does not know (a bug, or a library error nobody translated)."""


def _die(phy: int) -> Die:
    return Die(
        vdie_id=f"{phy:08X}-00000000-00000000-00000000-00000000",
        model="910B3",
        card_id=phy,
        chip_id=0,
        phy_id=phy,
        logic_id=phy,
        pci_bus_id=f"0000:{phy + 1:02x}:00.0",
        numa_node=0,
        memory_mib=65536,
        aicore=20,
        aicpu=7,
    )


INVENTORY = Inventory(dies=(_die(0), _die(1)))


@dataclass
class World:
    root: Path
    store: FakeStore
    daemon: FakeDaemon
    status: FakeStatus
    claims: dict[str, dict[str, Any]]
    preparer: Preparer

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    def prepare(self, refs: list[ClaimRef]) -> dict[str, PrepareResult]:
        """What the helper hands the driver: each claim as the API holds it (the tests' ``claims``)."""
        return self.preparer.prepare([ResourceClaim(ref, self.claims[ref.name]) for ref in refs])

    def conf(self, uid: str) -> Path:
        return self.root / "run" / "claims" / uid / "client.conf"

    def spec(self, uid: str) -> Path:
        return self.cdi_dir / cdi.spec_file_name(KIND, uid)

    def remains(self, uid: str) -> Remains:
        entry = self.store.get(uid)
        return Remains(
            state=entry.state if entry else None,
            aclserver=uid in self.daemon.registered,
            conf=self.conf(uid).exists(),
            cdi=self.spec(uid).exists(),
            status=any(d["conditions"][0]["status"] == "True" for d in self.status.written.get(uid, [])),
        )


@dataclass(frozen=True)
class Remains:
    state: ClaimState | None
    aclserver: bool
    conf: bool
    cdi: bool
    status: bool


NOTHING = Remains(state=None, aclserver=False, conf=False, cdi=False, status=False)
DONE = Remains(ClaimState.PREPARE_COMPLETED, aclserver=True, conf=True, cdi=True, status=True)
WHOLE_DONE = Remains(ClaimState.PREPARE_COMPLETED, aclserver=False, conf=False, cdi=True, status=True)


@pytest.fixture
def world(tmp_path: Path) -> World:
    store = FakeStore(tmp_path / "state")
    daemon = FakeDaemon(tmp_path / "shm")
    status = FakeStatus()
    claims: dict[str, dict[str, Any]] = {}
    devroot.build_device_root(tmp_path / "root", INVENTORY)
    preparer = Preparer(
        settings=PrepareSettings(
            driver_name=DRIVER,
            pool_name=POOL,
            cdi_dir=tmp_path / "cdi",
            cdi_kind=KIND,
            device_root=tmp_path / "root",
            run_dir=tmp_path / "run",
            daemon_retry_seconds=0.0,
        ),
        store=store,  # type: ignore[arg-type]
        inventory=lambda: INVENTORY,
        daemon=daemon,
        status=status,
    )
    return World(tmp_path, store, daemon, status, claims, preparer)


def _claim(
    world: World, name: str, results: list[dict[str, Any]], config: list[dict[str, Any]] | None = None
) -> ClaimRef:
    uid = f"0b7d7a5c-1111-2222-3333-{len(world.claims):012d}"
    world.claims[name] = {
        "metadata": {"uid": uid, "name": name, "namespace": "ns"},
        "status": {"allocation": {"devices": {"results": results, "config": config or []}}},
    }
    return ClaimRef("ns", uid, name)


def _share(
    phy: int = 0, memory: str = "256Mi", compute: str = "10", request: str = "vnpu", policy: str = "elastic"
) -> dict[str, Any]:
    return {
        "request": request,
        "driver": DRIVER,
        "pool": POOL,
        "device": f"vnpu-{phy}" if policy == "elastic" else f"vnpu-{phy}-{policy}",
        "shareID": f"5a4e{phy:04d}-0000-0000-0000-000000000000",
        "consumedCapacity": {"memory": memory, "compute": compute},
    }


def _whole(phy: int = 1) -> dict[str, Any]:
    return {"request": "npu", "driver": DRIVER, "pool": POOL, "device": f"npu-{phy}"}


def _policy(policy: str) -> list[dict[str, Any]]:
    params = {"apiVersion": "npu.flexnpu.io/v1alpha1", "kind": "VnpuConfig", "policy": policy}
    return [{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": params}}]


# -- the happy path ------------------------------------------------------------------------------


def test_share_prepare_makes_every_effect_and_renders_them_once(world: World) -> None:
    ref = _claim(world, "a", [_share()])
    res = world.prepare([ref])[ref.uid]
    assert res.error == ""
    assert world.remains(ref.uid) == DONE
    (dev,) = res.devices
    assert dev.cdi_device_ids == (f"flexnpu.io/vnpu={ref.uid}-vnpu-0-{_share()['shareID']}",)
    spec = json.loads(world.spec(ref.uid).read_text())
    assert [d["name"] for d in spec["devices"]] == [dev.cdi_device_ids[0].split("=", 1)[1]]
    conf = wirefiles.load_client_conf(world.conf(ref.uid))
    assert (conf.claim_uid, conf.endpoints.tcp) == (ref.uid, "127.0.0.1:40000")
    assert [(s.virtual_id, s.memory_bytes, s.compute_percent) for s in conf.shares] == [(0, 256 * MIB, 10)]
    assert conf.soc_name.startswith("Ascend")  # the die's, which aclrtGetSocName answers
    (doc,) = world.status.written[ref.uid]
    assert doc["data"]["endpoint"] == "127.0.0.1:40000" and doc["conditions"][0]["status"] == "True"
    entry = world.store.get(ref.uid)
    assert entry is not None and entry.status_docs == (doc,)  # what was written is what is recorded
    assert entry.registration is not None and entry.registration.token == conf.token
    assert world.daemon.registered[ref.uid].token == conf.token


def test_repeat_prepare_returns_the_same_devices_and_puts_back_lost_files(world: World) -> None:
    ref = _claim(world, "a", [_share()])
    first = world.prepare([ref])[ref.uid]
    world.spec(ref.uid).unlink()
    world.conf(ref.uid).unlink()
    again = world.prepare([ref])[ref.uid]
    assert again == first
    assert world.remains(ref.uid) == DONE


def test_unprepare_undoes_everything_and_is_idempotent(world: World) -> None:
    ref = _claim(world, "a", [_share()])
    world.prepare([ref])
    assert world.preparer.unprepare([ref]) == {ref.uid: ""}
    assert world.remains(ref.uid) == NOTHING
    assert world.preparer.unprepare([ref]) == {ref.uid: ""}
    assert not list((world.root / "state" / "locks").iterdir())  # the claim's lock file went with it


# -- a recorded step raises during prepare -------------------------------------------------------


def _fail_update(n: int, error: Exception | None = None) -> Callable[[World, pytest.MonkeyPatch], None]:
    def arm(world: World, _mp: pytest.MonkeyPatch) -> None:
        world.store.fail_at = world.store.updates + n
        if error is not None:
            world.store.error = error

    return arm


def _fail_register(error: Exception) -> Callable[[World, pytest.MonkeyPatch], None]:
    def arm(world: World, _mp: pytest.MonkeyPatch) -> None:
        world.daemon.fail_register = error

    return arm


def _enospc(which: str) -> Callable[[World, pytest.MonkeyPatch], None]:
    """The file write of effect ``which`` fails as on a full disk (the real writer, told to fail)."""

    def arm(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
        real = files.write_atomic

        def write_atomic(path: Path, data: bytes, **kw: Any) -> None:
            if (which == "client-conf") == (path.name == "client.conf"):
                raise files.WriteFailed(
                    errno.ENOSPC, f"cannot write {path}: No space left on device", str(path)
                )
            real(path, data, **kw)

        monkeypatch.setattr(files, "write_atomic", write_atomic)

    return arm


PREPARE_FAULTS = [
    pytest.param(_fail_update(1), NOTHING, "disk full", id="intent-record"),
    pytest.param(_fail_register(Unavailable("daemon down")), NOTHING, "daemon down", id="daemon-unavailable"),
    pytest.param(
        _fail_register(Boom("bug in the daemon client")), NOTHING, "Internal", id="daemon-unknown-error"
    ),
    pytest.param(_enospc("client-conf"), NOTHING, "No space left", id="client-conf-write"),
    pytest.param(_enospc("cdi-spec"), NOTHING, "No space left", id="cdi-spec-write"),
    pytest.param(_fail_update(2), NOTHING, "disk full", id="completion-record"),
    pytest.param(_fail_update(2, Boom("weird")), NOTHING, "Internal", id="completion-unknown-error"),
]


@pytest.mark.parametrize(("arm", "want", "message"), PREPARE_FAULTS)
def test_prepare_that_fails_at_a_step_leaves_nothing(
    world: World,
    monkeypatch: pytest.MonkeyPatch,
    arm: Callable[[World, pytest.MonkeyPatch], None],
    want: Remains,
    message: str,
) -> None:
    keep = _claim(world, "keep", [_share(phy=1)])
    assert world.prepare([keep])[keep.uid].error == ""
    ref = _claim(world, "a", [_share()])
    arm(world, monkeypatch)
    res = world.prepare([ref])[ref.uid]
    assert res.devices == () and ref.uid in res.error and message in res.error
    assert world.remains(ref.uid) == want
    assert not list(world.root.glob("run/claims/*/.*tmp*")) and not list(world.root.glob("cdi/.*tmp*"))
    assert not (world.root / "state" / "locks" / f"{ref.uid}.lock").exists()
    (doc,) = world.status.written[ref.uid]  # kubectl describe says why
    assert doc["conditions"][0]["status"] == "False"
    monkeypatch.undo()
    world.store.fail_at = 0
    world.daemon.fail_register = None
    assert world.remains(keep.uid) == DONE  # the other claim is untouched
    assert world.prepare([ref])[ref.uid].error == ""  # and the kubelet's retry works
    assert world.remains(ref.uid) == DONE


def test_prepare_whose_status_write_fails_is_still_prepared(world: World) -> None:
    ref = _claim(world, "a", [_share()])
    world.status.fail = Unavailable("API down")
    res = world.prepare([ref])[ref.uid]
    assert res.error == "" and res.devices
    assert world.remains(ref.uid) == Remains(ClaimState.PREPARE_COMPLETED, True, True, True, status=False)


def test_failed_prepare_writes_ready_false_with_the_error_code(world: World) -> None:
    ref = _claim(world, "a", [_share()], _policy("nonsense"))
    res = world.prepare([ref])[ref.uid]
    assert "InvalidOpaqueConfig" in res.error
    (doc,) = world.status.written[ref.uid]
    assert (doc["conditions"][0]["status"], doc["conditions"][0]["reason"]) == (
        "False",
        "InvalidOpaqueConfig",
    )
    assert world.store.updates == 0  # refused before any recorded step


def test_rollback_that_cannot_finish_keeps_the_entry_for_the_reconciler(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = _claim(world, "a", [_share()])
    _enospc("cdi-spec")(world, monkeypatch)
    world.daemon.fail_unregister = Unavailable("daemon gone")
    res = world.prepare([ref])[ref.uid]
    assert "claim" in res.error
    assert world.remains(ref.uid).state == ClaimState.PREPARE_STARTED  # doubt keeps the record
    world.daemon.fail_unregister = None
    monkeypatch.undo()
    assert world.preparer.settle_interrupted() == [ref.uid]
    assert world.remains(ref.uid) == NOTHING


def _kubelet_unprepares(world: World, ref: ClaimRef) -> None:
    assert world.preparer.unprepare([ref]) == {ref.uid: ""}


def _reconciler_rolls_back(world: World, ref: ClaimRef) -> None:
    assert world.preparer.settle_interrupted() == [ref.uid]


@pytest.mark.parametrize("finish", [_kubelet_unprepares, _reconciler_rolls_back])
def test_a_refused_claim_keeps_its_unfinished_entry_until_it_is_undone(
    world: World, monkeypatch: pytest.MonkeyPatch, finish: Callable[[World, ClaimRef], None]
) -> None:
    """A prepare whose rollback could not finish leaves its intent; the claim's next prepare is refused
    (its config became invalid): the unfinished entry and its registration are kept, not undone before
    the refusal; the kubelet's unprepare or the reconciler's pass then undoes everything."""
    ref = _claim(world, "a", [_share()])
    _enospc("cdi-spec")(world, monkeypatch)
    world.daemon.fail_unregister = Unavailable("daemon gone")
    assert "claim" in world.prepare([ref])[ref.uid].error
    kept = world.remains(ref.uid)
    assert kept.state == ClaimState.PREPARE_STARTED and kept.aclserver
    world.daemon.fail_unregister = None
    monkeypatch.undo()
    world.claims["a"]["status"]["allocation"]["devices"]["config"] = _policy("nonsense")
    assert "InvalidOpaqueConfig" in world.prepare([ref])[ref.uid].error
    assert world.remains(ref.uid) == kept, "the refusal undid nothing"
    finish(world, ref)
    assert world.remains(ref.uid) == NOTHING


def test_a_claim_lock_timeout_writes_no_status_and_changes_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another call on the claim holds its lock past the budget: the prepare answers busy, naming the
    claim, and writes no Ready=False over what that other call is doing; once it is free, it prepares."""
    ref = _claim(world, "a", [_share()])
    monkeypatch.setattr(world.preparer.effects, "lock_budget", lambda: 0.05)
    with world.store.claim_locks.hold(ref.uid, timeout=0):  # the other call, in flight
        res = world.prepare([ref])[ref.uid]
    assert ref.uid in res.error and "still running" in res.error
    assert ref.uid not in world.status.written and world.remains(ref.uid) == NOTHING
    assert world.prepare([ref])[ref.uid].error == "" and world.remains(ref.uid) == DONE


# -- a recorded step raises during unprepare -----------------------------------------------------


def _fail_unregister(world: World, _mp: pytest.MonkeyPatch) -> None:
    world.daemon.fail_unregister = Unavailable("daemon down")


UNPREPARE_FAULTS = [
    pytest.param(_fail_update(1), DONE, id="intent-record"),
    pytest.param(
        _fail_unregister,
        Remains(ClaimState.UNPREPARE_STARTED, aclserver=True, conf=False, cdi=False, status=False),
        id="daemon-unregister",
    ),
    pytest.param(
        _fail_update(2),
        Remains(ClaimState.UNPREPARE_STARTED, aclserver=False, conf=False, cdi=False, status=False),
        id="drop-record",
    ),
]


@pytest.mark.parametrize(("arm", "want"), UNPREPARE_FAULTS)
def test_unprepare_that_fails_at_a_step_keeps_the_entry_and_a_retry_finishes(
    world: World,
    monkeypatch: pytest.MonkeyPatch,
    arm: Callable[[World, pytest.MonkeyPatch], None],
    want: Remains,
) -> None:
    ref = _claim(world, "a", [_share()])
    world.prepare([ref])
    arm(world, monkeypatch)
    err = world.preparer.unprepare([ref])[ref.uid]
    assert ref.uid in err
    assert world.remains(ref.uid) == want
    world.daemon.fail_unregister = None
    world.store.fail_at = 0
    assert world.preparer.unprepare([ref]) == {ref.uid: ""}
    assert world.remains(ref.uid) == NOTHING


# -- refusals ------------------------------------------------------------------------------------


def test_whole_die_already_shared_is_refused_before_any_effect(world: World) -> None:
    a = _claim(world, "a", [_share(phy=1)])
    world.prepare([a])
    b = _claim(world, "b", [_whole(phy=1)])
    res = world.prepare([b])[b.uid]
    assert "DeviceBusy" in res.error and "ns/a" in res.error
    assert world.remains(b.uid) == NOTHING


def test_policy_conflict_with_another_claim_is_refused(world: World) -> None:
    """The guard, for a scheduler that could not see the policy (a pool published without counters)."""
    a = _claim(world, "a", [_share(policy="fixed")], _policy("fixed"))
    world.prepare([a])
    b = _claim(world, "b", [_share()], _policy("elastic"))
    assert "PolicyConflict" in world.prepare([b])[b.uid].error
    assert world.remains(b.uid) == NOTHING
    assert not (world.root / "state" / "locks" / f"{b.uid}.lock").exists()  # no lock file left behind


@pytest.mark.parametrize(
    ("device_policy", "config", "want"),
    [
        pytest.param("elastic", None, "elastic", id="the-default-device-is-elastic"),
        pytest.param("fixed", None, "fixed", id="the-device-decides-when-no-config-does"),
        pytest.param("best-effort", "best-effort", "best-effort", id="a-config-may-restate-it"),
    ],
)
def test_a_share_runs_under_its_devices_policy(
    world: World, device_policy: str, config: str | None, want: str
) -> None:
    ref = _claim(world, "a", [_share(policy=device_policy)], _policy(config) if config else None)
    res = world.prepare([ref])[ref.uid]
    assert res.error == "", res.error
    (request,) = world.daemon.registered.values()
    assert [s.policy for s in request.shares] == [want]


def test_a_claim_prepared_before_share_devices_had_a_policy_is_prepared_again(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade keeps running claims: only a new prepare must agree with its device's policy."""
    from dra_driver import sharing

    ref = _claim(world, "old", [_share()], _policy("fixed"))  # as an earlier release accepted it
    with monkeypatch.context() as m:
        m.setattr(sharing, "check_device_policies", lambda *_a, **_k: None)
        first = world.prepare([ref])[ref.uid]
    assert first.error == ""
    assert world.prepare([ref])[ref.uid] == first  # the kubelet's repeat prepare
    (request,) = world.daemon.registered.values()
    assert [s.policy for s in request.shares] == ["fixed"]


@pytest.mark.parametrize(
    ("transport", "unix_only"),
    [
        pytest.param("unix", True, id="unix-gets-no-tcp-listener"),
        pytest.param("tcp", False, id="tcp"),
        pytest.param(None, False, id="auto-keeps-both"),
    ],
)
def test_a_claim_that_asked_for_the_unix_socket_only_asks_the_daemon_for_no_tcp_listener(
    world: World, transport: str | None, unix_only: bool
) -> None:
    """Issue 25 class 1: no TCP listener a claim did not ask for."""
    config = None
    if transport is not None:
        config = _policy("elastic")
        config[0]["opaque"]["parameters"]["transport"] = transport
    ref = _claim(world, "a", [_share()], config)
    assert world.prepare([ref])[ref.uid].error == ""
    (request,) = world.daemon.registered.values()
    assert request.unix_only is unix_only
    conf = json.loads(world.conf(ref.uid).read_text())
    assert ("tcp" in conf["endpoints"]) is (transport != "unix")


def test_a_config_that_disagrees_with_the_share_device_is_refused(world: World) -> None:
    ref = _claim(world, "a", [_share()], _policy("fixed"))  # the scheduler chose the elastic device
    err = world.prepare([ref])[ref.uid].error
    assert "InvalidOpaqueConfig" in err and ref.uid in err and "config[0].opaque.parameters.policy" in err
    assert "vnpu-0" in err and "vnpu-fixed.flexnpu.io" in err
    assert world.remains(ref.uid) == NOTHING and not world.daemon.registered
    assert not (world.root / "state" / "locks" / f"{ref.uid}.lock").exists()


def _host(value: str, source: str = "FromClaim", index: int = 0) -> dict[str, Any]:
    params = {"apiVersion": "npu.flexnpu.io/v1alpha1", "kind": "VnpuConfig", "hostMemory": value}
    return {"source": source, "requests": [], "opaque": {"driver": DRIVER, "parameters": params}}


@pytest.mark.parametrize(
    ("config", "memory", "field", "message"),
    [
        # issue 25 class 2: 1Ti on a 128 MiB share became the aclserver's memory.max and tmpfs size
        pytest.param([_host("1Ti")], "128Mi", "config[0].opaque.parameters.hostMemory",
                     "asks for '1Ti' of host memory; the most is 256Mi for a share of 128Mi", id="1Ti-on-128Mi"),
        pytest.param([_host("256Mi", "FromClass", 0), _host("512Mi", "FromClaim", 1)], "512Mi",
                     "config[1].opaque.parameters.hostMemory", "more than its DeviceClass's 256Mi",
                     id="claim-over-its-class"),
    ],
)  # fmt: skip
def test_a_claim_cannot_choose_its_own_host_memory_bound(
    world: World, config: list[dict[str, Any]], memory: str, field: str, message: str
) -> None:
    ref = _claim(world, "greedy", [_share(memory=memory)], config)
    err = world.prepare([ref])[ref.uid].error
    assert "InvalidOpaqueConfig" in err and ref.uid in err and "ns/greedy" in err, err
    assert field in err and message in err, err
    assert world.remains(ref.uid) == NOTHING and not world.daemon.registered


def test_a_claim_may_ask_for_less_host_memory_than_its_class(world: World) -> None:
    ref = _claim(
        world, "modest", [_share(memory="512Mi")], [_host("1Gi", "FromClass"), _host("64Mi", index=1)]
    )
    assert world.prepare([ref])[ref.uid].error == ""
    (request,) = world.daemon.registered.values()
    assert [s.host_memory_bytes for s in request.shares] == [64 * MIB]


def test_a_claim_prepared_under_a_larger_bound_is_prepared_again(world: World) -> None:
    """Lowering the bound refuses new claims only: the kubelet's repeat prepare of a live one succeeds."""
    from dra_driver import sharing

    ref = _claim(world, "early", [_share(memory="128Mi")], [_host("1Gi")])
    world.preparer.settings = replace(world.preparer.settings, host_memory=sharing.HostMemoryBound(ratio=8))
    first = world.prepare([ref])[ref.uid]
    assert first.error == ""
    world.preparer.settings = replace(world.preparer.settings, host_memory=sharing.HostMemoryBound())
    assert world.prepare([ref])[ref.uid] == first
    assert world.remains(ref.uid) == DONE


def test_a_repeat_prepare_on_a_withdrawn_die_answers_from_the_checkpoint(world: World) -> None:
    """Issue 25 ("also seen"): die 1 withdrawn from the node while a claim on it is prepared; the
    kubelet's repeat prepare (a pod restart) returns the recorded devices and removes nothing. A claim
    whose allocation differs from the record still gets DeviceNotFound."""
    ref = _claim(world, "a", [_share(phy=1)])
    first = world.prepare([ref])[ref.uid]
    assert first.error == ""
    world.preparer.inventory = lambda: Inventory(dies=(_die(0),))
    assert world.prepare([ref])[ref.uid] == first
    assert world.remains(ref.uid) == DONE and not world.daemon.unregistered
    other = _claim(world, "b", [_share(phy=1)])
    assert "DeviceNotFound" in world.prepare([other])[other.uid].error
    world.claims["a"]["status"]["allocation"]["devices"]["results"][0]["shareID"] = (
        "5a4e9999-0000-0000-0000-000000000000"
    )
    assert "DeviceNotFound" in world.prepare([ref])[ref.uid].error


def test_one_bad_claim_does_not_fail_the_batch(world: World) -> None:
    good = _claim(world, "good", [_whole(phy=0)])
    bad = _claim(world, "bad", [_share(memory="100Mi")])
    out = world.prepare([bad, good])
    assert "QuotaInvalid" in out[bad.uid].error
    assert out[good.uid].error == "" and world.remains(good.uid) == WHOLE_DONE


def test_unknown_exception_becomes_internal_naming_the_claim(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = _claim(world, "a", [_share()])

    def broken(*_a: Any, **_k: Any) -> Any:
        raise Boom("x" * 5000)

    monkeypatch.setattr(plan_mod, "plan_claim", broken)
    res = world.prepare([ref])[ref.uid]
    assert res.error.startswith(f"claim {ref.uid}: internal error: Boom: xxx") and "[Internal]" in res.error
    assert len(res.error) < 400  # input is quoted at most 200 characters


def test_in_flight_claim_is_not_rolled_back_by_the_reconciler(world: World) -> None:
    ref = _claim(world, "a", [_share()])
    seen: list[list[str]] = []

    def register(request: RegisterRequest) -> RegisterResult:
        # the reconciler's pass runs while this claim talks to the daemon (its entry: PrepareStarted)
        seen.append(world.preparer.settle_interrupted())
        return FakeDaemon.register(world.daemon, request)

    world.daemon.register = register  # type: ignore[method-assign]
    assert world.prepare([ref])[ref.uid].error == ""
    assert seen == [[]] and world.remains(ref.uid) == DONE


def test_invalid_input_is_not_an_internal_error(world: World) -> None:
    """A malformed UID is refused once, where the kubelet's call comes in (the helper's batch), with
    the driver's error text."""
    from dra_kubeletplugin.claimbatch import BatchRunner
    from dra_kubeletplugin.serialize import CallSerializer
    from kubeletplugin.driver import NpuDriver

    ref = ClaimRef("ns", "bad_uid!", "a")
    world.claims["a"] = {"metadata": {"uid": "bad_uid!", "name": "a", "namespace": "ns"}}
    driver = NpuDriver(world.preparer, telemetry=world.preparer.telemetry)
    runner = BatchRunner(driver, fetcher=None, serializer=CallSerializer(enabled=False))
    res = runner.prepare([ref])[ref.uid]
    assert isinstance(res.error, str) and "InvalidPath" in res.error
    assert not isinstance(InvalidInput("x"), StateError)


def test_batched_unprepare_releases_every_claim_and_one_failure_stays_its_own(world: World) -> None:
    refs = [_claim(world, f"c{i}", [_share(phy=i % 2, memory="128Mi", compute="1")]) for i in range(12)]
    assert all(r.error == "" for r in world.prepare(refs).values())
    world.daemon.fail_uids = {refs[5].uid}
    out = world.preparer.unprepare(refs)
    assert set(out) == {r.uid for r in refs}
    assert refs[5].uid in out[refs[5].uid] and "daemon cannot stop this one" in out[refs[5].uid]
    assert all(out[r.uid] == "" for r in refs if r is not refs[5])
    assert [r.uid for r in refs if world.remains(r.uid) != NOTHING] == [refs[5].uid]
    assert world.remains(refs[5].uid).state == ClaimState.UNPREPARE_STARTED


def test_missing_device_node_fails_the_claim_before_its_spec_is_written(world: World) -> None:
    (world.root / "root" / "dev" / "davinci1").unlink()
    ref = _claim(world, "a", [_whole(phy=1)])
    res = world.prepare([ref])[ref.uid]
    assert "DeviceNotFound" in res.error and "dev/davinci1" in res.error and ref.uid in res.error
    assert world.remains(ref.uid) == NOTHING


def _vnpus(n: object) -> list[dict[str, Any]]:
    params = {"apiVersion": "npu.flexnpu.io/v1alpha1", "kind": "VnpuConfig", "vnpus": n}
    return [{"source": "FromClaim", "requests": ["vnpu"], "opaque": {"driver": DRIVER, "parameters": params}}]


def test_equal_distribution_splits_one_share_into_n_vnpus_of_one_aclserver(world: World) -> None:
    ref = _claim(world, "a", [_share(memory="512Mi", compute="20")], _vnpus(4))
    res = world.prepare([ref])[ref.uid]
    assert res.error == "" and len(res.devices) == 1  # one allocated device, one CDI device
    conf = wirefiles.load_client_conf(world.conf(ref.uid))
    assert [(s.virtual_id, s.memory_bytes, s.compute_percent) for s in conf.shares] == [
        (i, 128 * MIB, 5) for i in range(4)
    ]
    (request,) = world.daemon.registered.values()  # one aclserver serves all four
    assert [(s.virtual_id, s.die_phy_id, s.memory_bytes) for s in request.shares] == [
        (i, 0, 128 * MIB) for i in range(4)
    ]
    spec = json.loads(world.spec(ref.uid).read_text())
    assert "FLEXNPU_VISIBLE_VNPUS=0,1,2,3" in spec["containerEdits"]["env"]
    (dev,) = spec["devices"]
    assert dev["containerEdits"]["env"] == [f"FLEXNPU_VNPU_{i}=vnpu-0" for i in range(4)]
    (doc,) = world.status.written[ref.uid]
    assert doc["data"]["virtualIDs"] == [0, 1, 2, 3] and doc["data"]["memoryBytes"] == 128 * MIB


@pytest.mark.parametrize(
    ("memory", "compute", "n", "field"),
    [
        pytest.param("256Mi", "20", 3, "memory", id="memory-not-whole-steps"),
        pytest.param("256Mi", "25", 2, "compute", id="compute-not-whole-percents"),
        pytest.param("128Mi", "10", 2, "memory", id="less-than-a-step-each"),
    ],
)
def test_equal_distribution_that_does_not_divide_is_refused(
    world: World, memory: str, compute: str, n: int, field: str
) -> None:
    ref = _claim(world, "a", [_share(memory=memory, compute=compute)], _vnpus(n))
    res = world.prepare([ref])[ref.uid]
    assert "QuotaInvalid" in res.error and f"consumedCapacity.{field}" in res.error and "divide" in res.error
    assert world.remains(ref.uid) == NOTHING


def test_a_memory_only_share_splits_its_uncapped_compute_without_dividing_it(world: World) -> None:
    (cfg,) = _vnpus(16)
    cfg["opaque"]["parameters"]["isolation"] = "memory-only"
    ref = _claim(world, "a", [_share(memory="2Gi", compute="1")], [cfg])
    res = world.prepare([ref])[ref.uid]
    assert res.error == "", res.error
    (request,) = world.daemon.registered.values()
    assert [(s.memory_bytes, s.compute_percent, s.memory_only) for s in request.shares] == [
        (128 * MIB, 0, True)
    ] * 16


@pytest.mark.parametrize("n", [0, 17, "2", True, 1.5], ids=["zero", "too-many", "string", "bool", "float"])
def test_bad_vnpus_value_is_a_clear_error(world: World, n: object) -> None:
    ref = _claim(world, "a", [_share()], _vnpus(n))
    res = world.prepare([ref])[ref.uid]
    assert "InvalidOpaqueConfig" in res.error and "opaque.parameters.vnpus" in res.error


def test_a_claim_is_not_started_after_the_kubelets_deadline(world: World) -> None:
    ref = _claim(world, "a", [_share()])
    token = CALL_DEADLINE.set(time.monotonic() - 1.0)
    try:
        res = world.prepare([ref])[ref.uid]
    finally:
        CALL_DEADLINE.reset(token)
    assert "deadline" in res.error and ref.uid in res.error
    assert world.store.updates == 0 and world.daemon.registered == {}


def test_daemon_retries_stop_at_the_kubelets_deadline(world: World) -> None:
    world.preparer.settings = replace(world.preparer.settings, daemon_retry_seconds=3600.0)
    world.preparer.effects.settings = world.preparer.settings
    attempts: list[float] = []

    def register(request: RegisterRequest) -> RegisterResult:
        attempts.append(time.monotonic())
        raise Unavailable("daemon restarting")

    world.daemon.register = register  # type: ignore[method-assign]
    ref = _claim(world, "a", [_share()])
    deadline = time.monotonic() + 0.5
    token = CALL_DEADLINE.set(deadline)
    try:
        res = world.prepare([ref])[ref.uid]
    finally:
        CALL_DEADLINE.reset(token)
    assert "daemon restarting" in res.error
    assert attempts and all(t <= deadline for t in attempts)  # no attempt after the deadline
    assert world.remains(ref.uid) == NOTHING


def test_recorded_paths_outside_the_driver_directories_are_never_removed(world: World) -> None:
    ref = _claim(world, "a", [_share()])
    world.prepare([ref])
    victim_file = world.root / "etc-passwd"
    victim_file.write_text("root:x:0:0")
    victim_dir = world.root / "home"
    (victim_dir / "claims" / ref.uid).mkdir(parents=True)
    entry = world.store.get(ref.uid)
    assert entry is not None
    hostile = replace(
        entry,
        effects=tuple(
            replace(e, ref=str(victim_file))
            if e.kind == EffectKind.CDI_SPEC
            else replace(e, ref=str(victim_dir / "claims" / ref.uid))
            if e.kind == EffectKind.CLIENT_CONF
            else e
            for e in entry.effects
        ),
    )
    world.store.claims[ref.uid] = hostile  # what a tampered checkpoint record says
    assert world.preparer.unprepare([ref]) == {ref.uid: ""}
    assert victim_file.read_text() == "root:x:0:0" and (victim_dir / "claims" / ref.uid).is_dir()
