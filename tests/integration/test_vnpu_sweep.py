"""The orphan sweep and hard vNPUs: destroyed only with proof of ownership; foreign ones held back."""

from __future__ import annotations

from pathlib import Path

from dra_driver import cdi, slices, sweep
from dra_driver.devices import Die, DieMode, Inventory
from dra_driver.vnpu import check_template, ownership
from dra_driver.vnpu.emulated import EmulatedVnpus
from dra_driver.vnpu.sweeping import HardSweep, foreign_vnpus, held_capacity

DIE = Die(
    vdie_id="00000000-00000000-00000000-00000000-00000000",
    model="910B3",
    card_id=0,
    chip_id=0,
    phy_id=1,
    logic_id=1,
    pci_bus_id="0000:01:00.0",
    numa_node=0,
    memory_mib=65536,
    aicore=20,
    aicpu=7,
)
INV = Inventory(dies=(DIE,))


def test_sweep_destroys_only_what_the_driver_made_for_a_gone_claim(tmp_path: Path) -> None:
    root, state = tmp_path / "root", tmp_path / "state"
    mgr = EmulatedVnpus(root, INV)
    small = check_template(DIE, "vir05_1c_16g", INV)
    for vid in (116, 117, 118, 119):
        mgr.create(DIE, small, vid)
    ownership.add(state, 116, "gone-claim")
    ownership.add(state, 117, "live-claim")
    ownership.add(state, 119, "gone-claim-2")
    ownership.add(state, 120, "gone-claim-3")  # recorded, never made
    # the emulated driver marks 119 as used by a container
    with mgr.hdk.transaction() as st:
        next(v for v in st["vnpus"] if v["id"] == 119)["inUse"] = True
    places = sweep.SweepPlaces(
        cdi_dir=tmp_path / "cdi",
        cdi_kind=cdi.Kind.parse("flexnpu.io/vnpu"),
        run_dir=tmp_path / "run",
        shm_dir=tmp_path / "shm",
        hard=HardSweep(mgr, lambda: INV, state),
    )
    found = sweep.find({"live-claim"}, places, None)
    assert [(o.kind, o.uid, o.ref) for o in found] == [
        ("hard-vnpu", "gone-claim", "vnpu 116"),
        ("vnpu-record", "gone-claim-3", "vnpu 120"),
    ]
    for orphan in found:
        sweep.remove(orphan, None, places)
    assert [v.vnpu_id for v in mgr.list()] == [117, 118, 119]  # live, foreign, in use
    assert not (root / "dev" / "vdavinci116").exists()
    assert ownership.load(state) == {117: "live-claim", 119: "gone-claim-2"}
    assert sweep.find({"live-claim"}, places, None) == []


def test_nothing_is_destroyed_when_the_ledger_cannot_be_read(tmp_path: Path) -> None:
    root, state = tmp_path / "root", tmp_path / "state"
    mgr = EmulatedVnpus(root, INV)
    mgr.create(DIE, check_template(DIE, "vir05_1c_16g", INV), 116)
    state.mkdir()
    (state / ownership.FILE_NAME).write_text("{torn")
    assert HardSweep(mgr, lambda: INV, state).find(set()) == []
    # and every vNPU then counts as made outside the driver: its capacity is held back
    assert [v.vnpu_id for v in foreign_vnpus(mgr, state) or ()] == [116]


def test_foreign_vnpus_are_published_without_their_capacity(tmp_path: Path) -> None:
    root, state = tmp_path / "root", tmp_path / "state"
    mgr = EmulatedVnpus(root, INV)
    mgr.create(DIE, check_template(DIE, "vir10_3c_32g", INV), 116)  # made by hand
    mgr.create(DIE, check_template(DIE, "vir05_1c_16g", INV), 117)
    ownership.add(state, 117, "claim")  # made by the driver: already counted by the scheduler
    foreign = foreign_vnpus(mgr, state)
    assert foreign is not None and [v.vnpu_id for v in foreign] == [116]
    held = held_capacity(foreign, INV)
    assert held == {1: slices.Held(aicore=10, aicpu=3, memory_mib=32768, media=0, vnpus=1)}
    pool = slices.build_pool(INV, driver_name="d", node_name="n", mode_of=lambda d: DieMode.ALL, held=held)
    assert "npu-1" not in pool.device_names and "vnpu-1" not in pool.device_names
    counters = next(c for s in pool.slices for c in s.get("sharedCounters", []))["counters"]
    assert counters["aicore"] == {"value": "10"} and counters["vnpus"] == {"value": "7"}
