"""Hard vNPUs in a claim (pure): IDs, per-claim errors, records, evidence, orphans; CDI edits; the ledger."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dra_driver import cdi, render
from dra_driver.devices import Die, DieMode, Health, Inventory
from dra_driver.errors import ErrorCode, InvalidInput, StateError
from dra_driver.plan import PlannedDevice
from dra_driver.vnpu import Vnpu, ownership
from dra_driver.vnpu.planning import from_evidence, from_records, orphans
from flexnpu_testing.vnpus import new_vnpus

DIE = Die(
    vdie_id="0000000A-00000000-00000000-00000000-00000000",
    model="910B3",
    card_id=1,
    chip_id=0,
    phy_id=1,
    logic_id=1,
    pci_bus_id="0000:02:00.0",
    numa_node=0,
    memory_mib=65536,
    aicore=20,
    aicpu=7,
)
INV = Inventory(dies=(DIE,))


def test_ids_skip_taken_ones_and_each_other() -> None:
    got = new_vnpus(
        [("a", "npu-1-vir10-3c-32g-0"), ("b", "npu-1-vir05-1c-16g-2")],
        inventory=INV,
        taken=[116],
        claim_uid="u",
    )
    assert [(v.request, v.template.name, v.vnpu_id) for v in got] == [
        ("a", "vir10_3c_32g", 117),
        ("b", "vir05_1c_16g", 118),
    ]
    assert got[0].to_dict() == {
        "vnpuID": 117,
        "phy": 1,
        "card": 1,
        "chip": 0,
        "template": "vir10_3c_32g",
        "device": "npu-1-vir10-3c-32g-0",
        "request": "a",
    }


# A device name that is no template device of this node is refused by the inventory on the prepare
# path (``Inventory.allocated``, tested there); planning's own refusal of it is reached by an adopt.
@pytest.mark.parametrize(
    ("entry", "device", "inventory", "taken", "exc", "code"),
    [
        pytest.param(
            "adopt", "npu-1", INV, [], InvalidInput, ErrorCode.DEVICE_NOT_FOUND, id="not-a-template-device"
        ),
        pytest.param(
            "adopt",
            "npu-9-vir10-3c-32g-0",
            INV,
            [],
            InvalidInput,
            ErrorCode.DEVICE_NOT_FOUND,
            id="unknown-die",
        ),
        pytest.param(
            "new", "npu-1-vir04-3c-0", INV, [], InvalidInput, ErrorCode.TEMPLATE_UNSUPPORTED, id="template"
        ),
        pytest.param(
            "adopt",
            "npu-1-vir04-3c-0",
            INV,
            [],
            InvalidInput,
            ErrorCode.TEMPLATE_UNSUPPORTED,
            id="template-adopted",
        ),
        pytest.param(
            "new",
            "npu-1-vir10-3c-32g-0",
            Inventory(dies=(dataclasses.replace(DIE, health=Health.UNHEALTHY),)),
            [],
            StateError,
            ErrorCode.DIE_UNHEALTHY,
            id="unhealthy",
        ),
        pytest.param(
            "new",
            "npu-1-vir10-3c-32g-0",
            INV,
            range(116, 124),
            StateError,
            ErrorCode.VNPU_ID_IN_USE,
            id="no-id",
        ),
    ],
)
def test_per_claim_errors(
    entry: str,
    device: str,
    inventory: Inventory,
    taken: range | list[int],
    exc: type[Exception],
    code: ErrorCode,
) -> None:
    with pytest.raises(exc) as info:
        if entry == "new":
            new_vnpus([("vnpu", device)], inventory=inventory, taken=taken, claim_uid="uid-1")
        else:
            from_evidence([("vnpu", device)], ledger={}, live=(), inventory=inventory, claim_uid="uid-1")
    err = info.value
    assert getattr(err, "code", None) == code
    assert getattr(err, "claim_uid", None) == "uid-1"
    assert getattr(err, "field", "").startswith("status.allocation.devices.results[vnpu/")


def test_edits_give_the_vnpu_node_and_nothing_of_the_die(tmp_path: Path) -> None:
    (v,) = new_vnpus([("vnpu", "npu-1-vir10-3c-32g-0")], inventory=INV, taken=[], claim_uid="u")
    layout = render.NodeLayout("d", "p", cdi.Kind.parse("flexnpu.io/vnpu"), tmp_path, tmp_path)
    device = PlannedDevice("vnpu", "p", v.device, DIE, DieMode.HARD, None, {}, False, vnpu=v)
    edits = render.device_edits(device, layout=layout, claim_uid="u")
    assert [(n.path, n.host_path) for n in edits.device_nodes] == [
        ("/dev/davinci116", str(tmp_path / "dev/vdavinci116"))
    ]
    assert all(n.path.rsplit("/", 1)[-1] != "davinci1" for n in edits.device_nodes)
    assert render.vnpu_spec_env([v]) == {"FLEXNPU_VNPU_IDS": "116", "FLEXNPU_TEMPLATES": "vir10_3c_32g"}
    assert render.vnpu_status_data(v) == {
        "mode": "hard",
        "die": 1,
        "vdieID": DIE.vdie_id,
        "model": "910B3",
        "template": "vir10_3c_32g",
        "vnpuID": 116,
        "deviceNode": "/dev/vdavinci116",
        "aicore": 10,
        "aicpu": 3,
        "memoryBytes": 32 * 1024**3,
    }


def test_orphans_need_proof_of_ownership() -> None:
    vs = [
        Vnpu(116, 1, 1, 0, "vir10_3c_32g"),
        Vnpu(117, 1, 1, 0, "vir05_1c_16g"),
        Vnpu(118, 1, 1, 0, "vir05_1c_16g", in_use=True),
    ]
    book = {116: "gone", 117: "live", 118: "gone"}
    assert [v.vnpu_id for v in orphans(vs, ledger=book, owners=["live"], checkpoint_readable=True)] == [116]
    assert orphans(vs, ledger=book, owners=[], checkpoint_readable=False) == ()
    assert orphans(vs, ledger={}, owners=[], checkpoint_readable=True) == ()  # made outside the driver


def test_ledger_round_trip_and_doubt(tmp_path: Path) -> None:
    assert ownership.load(tmp_path) == {}
    ownership.add(tmp_path, 116, "uid-a")
    ownership.add(tmp_path, 117, "uid-b")
    ownership.remove(tmp_path, 116)
    assert ownership.load(tmp_path) == {117: "uid-b"}
    (tmp_path / ownership.FILE_NAME).write_text("{not json")
    assert ownership.load(tmp_path) is None
    with pytest.raises(OSError):
        ownership.add(tmp_path, 118, "uid-c")


def test_smi_rows_name_template_die_owner_and_residual_state() -> None:
    from dra_driver.vnpu.report import hard_rows

    vs = [
        Vnpu(116, 1, 1, 0, "vir10_3c_32g"),
        Vnpu(117, 1, 1, 0, "vir05_1c_16g"),
        Vnpu(118, 1, 1, 0, "vir05_1c_16g"),
    ]
    rows = hard_rows(
        vs,
        ledger={116: "uid-a", 117: "uid-gone"},
        claims={"uid-a": ("ns/a", "PrepareCompleted")},
        inventory=INV,
    )
    assert [(r["DEVICE"], r["CLAIM"], r["RESIDUAL"][:3]) for r in rows] == [
        ("vnpu 116 vir10_3c_32g", "ns/a", "no"),
        ("vnpu 117 vir05_1c_16g", "-", "yes"),
        ("vnpu 118 vir05_1c_16g", "-", "no:"),
    ]
    assert rows[0]["MEM(MiB) USED/QUOTA"] == "-/32768" and rows[0]["ENDPOINT"] == "/dev/vdavinci116"
    assert "made outside" in rows[2]["RESIDUAL"]
    assert hard_rows(vs[:1], ledger=None, claims={}, inventory=INV)[0]["RESIDUAL"].startswith("?")


def test_recorded_vnpus_come_back_as_planned() -> None:
    planned = new_vnpus([("a", "npu-1-vir10-3c-32g-0")], inventory=INV, taken=[], claim_uid="u")
    assert from_records([v.to_dict() for v in planned], inventory=INV, claim_uid="u") == planned
    with pytest.raises(StateError) as info:
        from_records([{"phy": 1}], inventory=INV, claim_uid="u")
    assert info.value.code == ErrorCode.CHECKPOINT_CORRUPT


def _vnpu(vnpu_id: int, template: str = "vir10_3c_32g") -> Vnpu:
    return Vnpu(vnpu_id=vnpu_id, phy_id=1, card_id=1, chip_id=0, template=template)


DEVICE = "npu-1-vir10-3c-32g-0"


@pytest.mark.parametrize(
    ("book", "live", "want"),
    [
        pytest.param({117: "u"}, [_vnpu(117)], 117, id="live-vnpu-of-the-claim"),
        pytest.param({117: "u"}, [], 117, id="gone-after-a-reboot"),
        pytest.param({116: "u", 118: "u"}, [_vnpu(118)], 118, id="a-live-one-before-a-gone-one"),
        pytest.param({117: "u", 116: "other"}, [_vnpu(116), _vnpu(117)], 117, id="not-another-claims"),
    ],
)
def test_evidence_gives_each_template_device_its_own_vnpu(
    book: dict[int, str], live: list[Vnpu], want: int
) -> None:
    (v,) = from_evidence([("vnpu", DEVICE)], ledger=book, live=live, inventory=INV, claim_uid="u")
    assert (v.vnpu_id, v.device, v.template.name, v.die.phy_id) == (want, DEVICE, "vir10_3c_32g", 1)


@pytest.mark.parametrize(
    ("book", "live", "code"),
    [
        pytest.param(None, [], ErrorCode.VNPU_FAILED, id="ledger-unreadable"),
        pytest.param({}, [_vnpu(117)], ErrorCode.VNPU_FAILED, id="not-in-the-ledger"),
        pytest.param({117: "other"}, [_vnpu(117)], ErrorCode.VNPU_FAILED, id="another-claims"),
        pytest.param({117: "u"}, [_vnpu(117, "vir05_1c_16g")], ErrorCode.VNPU_FAILED, id="other-template"),
        pytest.param({212: "u"}, [], ErrorCode.VNPU_FAILED, id="id-of-another-die"),
    ],
)
def test_evidence_that_does_not_explain_a_template_device_is_refused(
    book: dict[int, str] | None, live: list[Vnpu], code: ErrorCode
) -> None:
    with pytest.raises(StateError) as info:
        from_evidence([("vnpu", DEVICE)], ledger=book, live=live, inventory=INV, claim_uid="u")
    assert info.value.code == code and info.value.claim_uid == "u"


def test_two_devices_never_share_one_vnpu() -> None:
    results = [("a", DEVICE), ("b", "npu-1-vir10-3c-32g-1")]
    with pytest.raises(StateError) as info:
        from_evidence(results, ledger={117: "u"}, live=[_vnpu(117)], inventory=INV, claim_uid="u")
    assert "npu-1-vir10-3c-32g-1" in str(info.value.field)
    got = from_evidence(results, ledger={117: "u", 119: "u"}, live=[_vnpu(117)], inventory=INV, claim_uid="u")
    assert [v.vnpu_id for v in got] == [117, 119]


def _planned(mode: DieMode, device: str, **kw: object) -> PlannedDevice:
    return PlannedDevice("vnpu", "p", device, DIE, mode, None, {}, False, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "device",
    [
        pytest.param(_planned(DieMode.HARD, DEVICE), id="template-without-its-vnpu"),
        pytest.param(_planned(DieMode.SOFT, "vnpu-1"), id="share-without-shares"),
        pytest.param(
            _planned(
                DieMode.WHOLE,
                "npu-1",
                vnpu=new_vnpus([("vnpu", DEVICE)], inventory=INV, taken=[], claim_uid="u")[0],
            ),
            id="whole-with-a-vnpu",
        ),
        pytest.param(_planned(DieMode.ALL, "npu-1"), id="a-die-mode-is-no-device-kind"),
    ],
)
def test_render_refuses_a_device_it_cannot_render_truthfully(device: PlannedDevice, tmp_path: Path) -> None:
    layout = render.NodeLayout("d", "p", cdi.Kind.parse("flexnpu.io/vnpu"), tmp_path, tmp_path)
    with pytest.raises(StateError) as info:
        render.device_edits(device, layout=layout, claim_uid="u")
    assert info.value.claim_uid == "u" and device.device in str(info.value.field)
