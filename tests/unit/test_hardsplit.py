"""The hard-vNPU effect: ledger before create, undo only what the claim made, repeat after a reboot."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dra_driver import logs
from dra_driver.devices import Die, Inventory
from dra_driver.errors import ErrorCode, FlexNPUError, StateError
from dra_driver.vnpu import Vnpu, check_template, ownership
from dra_driver.vnpu.emulated import EmulatedVnpus
from dra_driver.vnpu.planning import taken_ids
from flexnpu_testing.vnpus import new_vnpus
from kubeletplugin.hardsplit import HardVnpus

DIE = Die(
    vdie_id="00000000-00000000-00000000-00000000-00000000",
    model="910B3",
    card_id=0,
    chip_id=0,
    phy_id=0,
    logic_id=0,
    pci_bus_id="0000:01:00.0",
    numa_node=0,
    memory_mib=65536,
    aicore=20,
    aicpu=7,
)
INV = Inventory(dies=(DIE,))
CLOG = logs.claim_logger("uid-a", "ns", "c", base=logging.getLogger("test"))


def rec(vnpu_id: int = 100, template: str = "vir10_3c_32g") -> dict[str, object]:
    (v,) = new_vnpus(
        [("vnpu", f"npu-0-{template.replace('_', '-')}-0")], inventory=INV, taken=[], claim_uid="u"
    )
    return {**v.to_dict(), "vnpuID": vnpu_id}


@pytest.fixture
def hard(tmp_path: Path) -> HardVnpus:
    return HardVnpus(EmulatedVnpus(tmp_path / "root", INV), lambda: INV, tmp_path / "state")


def test_do_records_then_makes_and_undo_destroys_then_forgets(hard: HardVnpus) -> None:
    made = hard.do(rec(), "uid-a", CLOG)
    assert made.vnpu_id == 100 and ownership.load(hard.state_dir) == {100: "uid-a"}
    hard.undo(rec(), "uid-a", CLOG)
    assert hard.manager.list() == () and ownership.load(hard.state_dir) == {}
    hard.undo(rec(), "uid-a", CLOG)  # idempotent


def test_an_id_taken_outside_the_driver_is_never_destroyed(hard: HardVnpus) -> None:
    foreign = hard.manager.create(DIE, check_template(DIE, "vir05_1c_16g", INV), 100)
    with pytest.raises(StateError) as info:
        hard.do(rec(), "uid-a", CLOG)
    assert info.value.code == ErrorCode.VNPU_ID_IN_USE and info.value.claim_uid == "uid-a"
    hard.undo(rec(), "uid-a", CLOG)  # the rollback of that prepare
    assert hard.manager.list() == (foreign,) and ownership.load(hard.state_dir) == {}


def test_undo_keeps_a_vnpu_in_use(hard: HardVnpus) -> None:
    hard.do(rec(), "uid-a", CLOG)
    assert isinstance(hard.manager, EmulatedVnpus)
    with hard.manager.hdk.transaction() as st:
        st["vnpus"][0]["inUse"] = True
    with pytest.raises(StateError, match="still used"):
        hard.undo(rec(), "uid-a", CLOG)
    assert [v.vnpu_id for v in hard.manager.list()] == [100] and ownership.load(hard.state_dir) == {
        100: "uid-a"
    }


def test_ensure_makes_it_again_after_a_reboot(hard: HardVnpus) -> None:
    hard.do(rec(), "uid-a", CLOG)
    assert isinstance(hard.manager, EmulatedVnpus)
    hard.manager.hdk.state_file.unlink()  # the reboot dropped the vNPUs
    hard.ensure(rec(), "uid-a", CLOG)
    assert [v.vnpu_id for v in hard.manager.list()] == [100]


def test_unreadable_ledger_blocks_make_and_destroy(hard: HardVnpus) -> None:
    hard.do(rec(), "uid-a", CLOG)
    (hard.state_dir / ownership.FILE_NAME).write_text("{torn")
    with pytest.raises(FlexNPUError):
        hard.undo(rec(), "uid-a", CLOG)
    with pytest.raises(FlexNPUError):
        hard.do(rec(101, "vir05_1c_16g"), "uid-b", CLOG)
    assert [v.vnpu_id for v in hard.manager.list()] == [100]


def test_taken_ids() -> None:
    assert taken_ids([Vnpu(100, 0, 0, 0, "vir10_3c_32g")], [{"vnpuID": 101}]) == {100, 101}


# -- the plan and the rendering know hard-split devices (pure) -------------------------------------


def _claim(device: str) -> dict[str, object]:
    return {
        "metadata": {"uid": "uid-h", "namespace": "ns", "name": "c"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "vnpu", "driver": "npu.flexnpu.io", "pool": "node-1", "device": device}
                    ]
                }
            }
        },
    }


def _plan(device: str = "npu-0-vir10-3c-32g-1") -> object:
    from dra_driver.plan import plan_claim
    from dra_kubeletplugin.claims import ClaimRef

    return plan_claim(
        _claim(device),
        ref=ClaimRef("ns", "uid-h", "c"),
        driver_name="npu.flexnpu.io",
        pool_name="node-1",
        inventory=INV,
    )


def test_a_template_device_is_planned_in_hard_mode_and_rendered_as_its_vnpu(tmp_path: Path) -> None:
    from dra_driver import cdi, render
    from dra_driver.devices import DieMode
    from dra_driver.plan import ClaimPlan

    plan = _plan()
    assert isinstance(plan, ClaimPlan)
    assert [d.mode for d in plan.devices] == [DieMode.HARD] and plan.hard_results() == (
        ("vnpu", "npu-0-vir10-3c-32g-1"),
    )
    vnpus = new_vnpus(plan.hard_results(), inventory=INV, taken=[100], claim_uid="uid-h")
    planned = plan.with_vnpus(vnpus)
    layout = render.NodeLayout(
        driver_name="npu.flexnpu.io",
        pool_name="node-1",
        cdi_kind=cdi.Kind.parse("flexnpu.io/vnpu"),
        device_root=tmp_path,
        run_dir=tmp_path / "run",
    )
    out = render.render(planned, None, layout=layout, token="", driver_mounts=("/usr/local/dcmi",), now="t")
    (dev,) = out.spec.devices
    assert [(n.path, n.host_path) for n in dev.edits.device_nodes] == [
        ("/dev/davinci101", str(tmp_path / "dev/vdavinci101"))
    ]
    assert [n.path for n in out.spec.edits.device_nodes] == [
        "/dev/davinci_manager",
        "/dev/devmm_svm",
        "/dev/hisi_hdc",
    ]
    assert [m.container_path for m in out.spec.edits.mounts] == ["/usr/local/dcmi"]
    assert "FLEXNPU_VNPU_IDS=101" in out.spec.edits.env and not any(
        "PHYSICAL" in e for e in out.spec.edits.env
    )
    (status,) = out.status
    assert status["data"]["template"] == "vir10_3c_32g" and status["data"]["vnpuID"] == 101
    assert status["data"]["mode"] == "hard"


def test_a_share_and_a_template_of_one_die_conflict_on_the_node() -> None:
    from dra_driver.devices import DieMode
    from dra_driver.plan import ClaimPlan
    from dra_driver.records import HeldDie, check_conflicts

    plan = _plan()
    assert isinstance(plan, ClaimPlan)
    share = HeldDie(phy=0, mode=DieMode.SOFT, policy="elastic", namespace="ns", name="s", uid="uid-s")
    with pytest.raises(StateError) as info:
        check_conflicts(plan, [share])
    assert info.value.code == ErrorCode.DEVICE_BUSY
    other_template = HeldDie(phy=0, mode=DieMode.HARD, policy=None, namespace="ns", name="t", uid="uid-t")
    check_conflicts(plan, [other_template])  # templates share a die; the scheduler counted them
