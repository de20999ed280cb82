"""vNPU managers against real processes: the npu-smi backend runs the fake ``npu-smi`` executable,
the emulated backend reads the same state; errors on demand leave nothing half-made."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dra_driver import templates
from dra_driver.devices import Die, Inventory
from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput, StateError
from dra_driver.vnpu import Vnpu, check_template, free_vnpu_id
from dra_driver.vnpu.emulated import EmulatedVnpus
from dra_driver.vnpu.npu_smi import NpuSmiVnpus
from flexnpu_testing import fake_npu_smi

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "tests" / "data" / "npu-smi" / "a2-8x910b4"


@pytest.fixture
def smi(tmp_path: Path) -> tuple[Path, Path, NpuSmiVnpus, Inventory]:
    home, root = tmp_path / "smi", tmp_path / "root"
    exe = fake_npu_smi.install(home, device_root=root, samples=SAMPLES)
    inventory = fake_npu_smi._inventory(fake_npu_smi._config(home))
    return home, root, NpuSmiVnpus(str(exe), inventory, timeout=60), inventory


def die0(inventory: Inventory) -> Die:
    return sorted(inventory.dies, key=lambda d: d.phy_id)[0]


def test_create_list_destroy_through_npu_smi(smi: tuple[Path, Path, NpuSmiVnpus, Inventory]) -> None:
    home, root, mgr, inv = smi
    die = die0(inv)
    t = check_template(die, "vir10_3c_16g", inv)
    vnpu_id = free_vnpu_id(die, [])
    assert vnpu_id == die.phy_id * 16 + 100
    made = mgr.create(die, t, vnpu_id)
    assert made == Vnpu(vnpu_id, die.phy_id, die.card_id, die.chip_id, "vir10_3c_16g", vgroup=0)
    assert (root / "dev" / f"vdavinci{vnpu_id}").exists()
    assert mgr.list() == (made,)
    # the emulated backend sees the same world
    assert EmulatedVnpus(root, inv, state_file=home / "state.json").list() == (made,)
    assert [
        "set",
        "-t",
        "create-vnpu",
        "-i",
        str(die.card_id),
        "-c",
        str(die.chip_id),
        "-f",
        "vir10_3c_16g",
        "-v",
        str(vnpu_id),
    ] in fake_npu_smi.calls(home)
    assert mgr.destroy(die, vnpu_id) is True
    assert mgr.list() == () and not (root / "dev" / f"vdavinci{vnpu_id}").exists()
    assert mgr.destroy(die, vnpu_id) is False  # idempotent


def test_a_failed_create_that_made_the_vnpu_is_undone(smi: tuple[Path, Path, NpuSmiVnpus, Inventory]) -> None:
    home, root, mgr, inv = smi
    die = die0(inv)
    fake_npu_smi.inject(home, "create-vnpu", rc=1, stderr="Error: dcmi timeout", apply=True)
    with pytest.raises(FlexNPUError, match="dcmi timeout") as info:
        mgr.create(die, check_template(die, "vir05_1c_8g", inv), 100 + die.phy_id * 16)
    assert info.value.code == ErrorCode.VNPU_FAILED
    assert mgr.list() == () and not list((root / "dev").glob("vdavinci*"))


def test_a_create_reported_ok_but_missing_is_an_error(smi: tuple[Path, Path, NpuSmiVnpus, Inventory]) -> None:
    home, _, mgr, inv = smi
    die = die0(inv)
    fake_npu_smi.inject(home, "create-vnpu", rc=0, stdout="Status : OK\n")
    with pytest.raises(StateError, match="shows nothing") as info:
        mgr.create(die, check_template(die, "vir05_1c_8g", inv), 100 + die.phy_id * 16)
    assert info.value.code == ErrorCode.VNPU_FAILED


def test_id_collision_and_unsupported_template(smi: tuple[Path, Path, NpuSmiVnpus, Inventory]) -> None:
    _, _, mgr, inv = smi
    die = die0(inv)
    vnpu_id = 100 + die.phy_id * 16
    mgr.create(die, check_template(die, "vir05_1c_8g", inv), vnpu_id)
    with pytest.raises(StateError) as info:
        mgr.create(die, check_template(die, "vir05_1c_8g", inv), vnpu_id)
    assert info.value.code == ErrorCode.VNPU_ID_IN_USE and info.value.field == "vnpuID"
    with pytest.raises(InvalidInput) as bad:
        check_template(die, "vir12_3c_32g", inv)  # an A2 training template on a 910B4
    assert bad.value.code == ErrorCode.TEMPLATE_UNSUPPORTED and "vir05_1c_8g" in str(bad.value)
    assert [v.vnpu_id for v in mgr.list()] == [vnpu_id]


def test_the_die_refuses_more_than_it_has(smi: tuple[Path, Path, NpuSmiVnpus, Inventory]) -> None:
    _, _, mgr, inv = smi
    die = die0(inv)
    t = check_template(die, "vir10_3c_16g", inv)
    ids = list(templates.vnpu_id_range(die.model, die.phy_id))
    mgr.create(die, t, ids[0])
    mgr.create(die, t, ids[1])
    with pytest.raises(FlexNPUError, match="not enough AI Cores"):
        mgr.create(die, t, ids[2])
    assert [v.vnpu_id for v in mgr.list()] == ids[:2]


def test_unknown_info_vnpu_format_is_a_clear_error(smi: tuple[Path, Path, NpuSmiVnpus, Inventory]) -> None:
    home, _, mgr, inv = smi
    fake_npu_smi.inject(home, "info-vnpu", rc=0, stdout="| vNPU table v2 | id=100 |\n", times=-1)
    with pytest.raises(InvalidInput, match="Total number of vnpu") as info:
        mgr.list()
    assert info.value.code == ErrorCode.INVALID_NPU_SMI
    die = die0(inv)
    with pytest.raises(InvalidInput):
        mgr.create(die, check_template(die, "vir05_1c_8g", inv), 100 + die.phy_id * 16)
    assert not any(c[:3] == ["set", "-t", "create-vnpu"] for c in fake_npu_smi.calls(home))


def test_vnpu_mode_must_be_container(smi: tuple[Path, Path, NpuSmiVnpus, Inventory]) -> None:
    home, root, mgr, inv = smi
    die = die0(inv)
    mgr.check_prerequisites(die)
    exe = home / "npu-smi"
    import subprocess

    subprocess.run([str(exe), "set", "-t", "vnpu-mode", "-d", "1"], check=True, capture_output=True)
    with pytest.raises(StateError, match="vnpu-mode -d 0") as info:
        mgr.check_prerequisites(die)
    assert info.value.code == ErrorCode.VNPU_MODE
    with pytest.raises(StateError):
        EmulatedVnpus(root, inv, state_file=home / "state.json").check_prerequisites(die)
    with pytest.raises(FlexNPUError, match="not container"):
        mgr.create(die, check_template(die, "vir05_1c_8g", inv), 100 + die.phy_id * 16)
    assert mgr.list() == ()


def test_in_use_vnpus_are_reported(smi: tuple[Path, Path, NpuSmiVnpus, Inventory]) -> None:
    home, _, mgr, inv = smi
    die = die0(inv)
    made = mgr.create(die, check_template(die, "vir05_1c_8g", inv), 100 + die.phy_id * 16)
    fake_npu_smi.set_in_use(home, made.vnpu_id)
    assert [v.in_use for v in mgr.list()] == [True]


def test_template_info_of_the_fake_parses_back(smi: tuple[Path, Path, NpuSmiVnpus, Inventory]) -> None:
    home, _, _, _ = smi
    import subprocess

    out = subprocess.run(
        [str(home / "npu-smi"), "info", "-t", "template-info"], check=True, capture_output=True, text=True
    ).stdout
    assert templates.parse_template_info(out, model="910B4") == templates.for_model("910B4")


def test_emulated_backend_alone(tmp_path: Path) -> None:
    inv = Inventory(
        dies=(
            Die(
                vdie_id="00000000-00000000-00000000-00000000-00000000",
                model="310P3",
                card_id=1,
                chip_id=0,
                phy_id=4,
                logic_id=0,
                pci_bus_id="0000:01:00.0",
                numa_node=0,
                memory_mib=21527,
                aicore=8,
                aicpu=7,
            ),
        )
    )
    mgr = EmulatedVnpus(tmp_path, inv)
    die = inv.dies[0]
    a = mgr.create(die, check_template(die, "vir04", inv), 164)
    b = mgr.create(die, check_template(die, "vir04_3c", inv), 165)
    assert (a.vgroup, b.vgroup) == (0, 1)
    node = tmp_path / "dev" / "vdavinci164"
    assert a.device_node == "/dev/vdavinci164"
    assert stat.S_ISCHR(node.stat().st_mode) if os.geteuid() == 0 else node.is_file()
    with pytest.raises(StateError, match="not enough"):
        mgr.create(die, check_template(die, "vir01", inv), 166)
    with pytest.raises(StateError, match="outside"):
        mgr.create(die, check_template(die, "vir01", inv), 180)
    assert [v.vnpu_id for v in mgr.list()] == [164, 165]
    assert mgr.destroy(die, 164) and not (tmp_path / "dev" / "vdavinci164").exists()
