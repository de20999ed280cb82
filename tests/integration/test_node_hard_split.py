"""Hard-split vNPUs through the real node process (mode ``all``) and the kubelet simulator.

Publishing (templates next to whole and soft; a die with a vNPU made outside the driver), a
template claim prepared into a vNPU device node and destroyed at unprepare, a whole-die claim
that waits while it lives, ``flexnpu-smi info``, and the faults: a SIGKILL after every recorded
step, a claim deleted while the node is down, a reboot that drops the vNPUs. The emulated vNPU
backend keeps its vNPUs under the node's device root (``dra_driver/vnpu/emulated.py``).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from dra_driver.checkpoint import CheckpointStore, EffectKind
from dra_driver.discovery import emulated
from dra_driver.vnpu import check_template, ownership
from dra_driver.vnpu.emulated import EmulatedVnpus
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_testing.kubelet import KubeletError
from flexnpu_testing.scheduler import Unschedulable
from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import DRIVER, INVENTORIES, NAMESPACE, NODE, Node
from tests.integration.lifecycle_helpers import claim_doc, pod_ref, smi

HARD_CEL = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].mode == "hard"'
INVENTORY = "eight-910b4.yaml"


@pytest.fixture
def hard_node(node_factory: Callable[..., Node]) -> Callable[..., Node]:
    def make(*, daemon: bool = False, **env: str) -> Node:
        n = node_factory(INVENTORY, daemon=daemon, FLEXNPU_DEFAULT_MODE="all", **env)
        n.resource.create_device_class(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "vnpu-template.flexnpu.io"},
                "spec": {"selectors": [{"cel": {"expression": HARD_CEL}}]},
            }
        )
        return n

    return make


def template_request(template: str, name: str = "vnpu") -> dict[str, Any]:
    return {
        "name": name,
        "exactly": {
            "deviceClassName": "vnpu-template.flexnpu.io",
            "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].template == "{template}"'}}],
        },
    }


def test_all_mode_publishes_templates_next_to_whole_and_soft(hard_node: Callable[..., Node]) -> None:
    node = hard_node().start()
    devices = wait_for(node.devices, what="published devices")
    names = {d["name"] for d in devices}
    assert {"npu-0", "vnpu-0", "npu-0-vir10-3c-16g-0", "npu-0-vir10-3c-16g-1", "npu-7-vir05-1c-8g-3"} <= names
    sets = {c["name"]: c["counters"] for s in node.slices() for c in s["spec"].get("sharedCounters") or []}
    assert sets["die-0"]["aicore"] == {"value": "20"} and sets["die-0"]["vnpus"] == {"value": "8"}


def test_a_die_with_a_vnpu_made_outside_the_driver_is_published_without_it(
    hard_node: Callable[..., Node],
) -> None:
    node = hard_node()
    inv = emulated.load_inventory(INVENTORIES / INVENTORY)
    die = inv.by_phy_id(3)
    assert die is not None
    EmulatedVnpus(node.dirs["devroot"], inv).create(
        die, check_template(die, "vir10_3c_16g", inv), 3 * 16 + 100
    )
    node.start()
    devices = wait_for(node.devices, what="published devices")
    names = {d["name"] for d in devices}
    assert "npu-3" not in names and "vnpu-3" not in names and "npu-2" in names
    sets = {c["name"]: c["counters"] for s in node.slices() for c in s["spec"].get("sharedCounters") or []}
    assert sets["die-3"]["aicore"] == {"value": "10"} and sets["die-3"]["vnpus"] == {"value": "7"}
    assert "was not made by this driver" in node.log()


# -- prepare creates, unprepare destroys -------------------------------------------------------

VNPU_TEMPLATE = "vir10_3c_16g"


def _vnpus(node: Node) -> list[Any]:
    return list(EmulatedVnpus(node.dirs["devroot"], emulated.load_inventory(INVENTORIES / INVENTORY)).list())


def _allocate(node: Node, name: str, requests: list[dict[str, Any]]) -> ClaimRef:

    uid = node.create_claim(name, requests)
    node.scheduler.allocate(NAMESPACE, name, NODE, reserved_for=[pod_ref(f"pod-{name}")])
    return ClaimRef(NAMESPACE, uid, name)


def _spec(node: Node, uid: str) -> dict[str, Any]:

    (spec,) = [json.loads(p.read_text()) for p in node.cdi_specs() if uid in p.name]
    out: dict[str, Any] = spec
    return out


@pytest.fixture
def serving(hard_node: Callable[..., Node]) -> Node:
    n = hard_node(FLEXNPU_RECONCILE_PERIOD_SECONDS="1", FLEXNPU_RESIDUAL_GRACE_SECONDS="2").start()
    wait_for(n.devices, what="published devices")
    return n


def test_a_template_claim_is_prepared_into_a_vnpu_and_destroyed_at_unprepare(serving: Node) -> None:

    n = serving
    ref = _allocate(n, "hard", [template_request(VNPU_TEMPLATE)])
    alloc = claim_doc(n, "hard")["status"]["allocation"]["devices"]["results"][0]
    assert alloc["device"].endswith("-vir10-3c-16g-0")
    assert n.kubelet is not None
    res = n.kubelet.prepare([ref])[ref.uid]
    assert res.error == "", res.error
    (vnpu,) = _vnpus(n)
    assert vnpu.template == VNPU_TEMPLATE and str(vnpu.phy_id) == alloc["device"].split("-")[1]
    assert vnpu.vnpu_id == vnpu.phy_id * 16 + 100
    spec = _spec(n, ref.uid)
    nodes = [
        (d["path"], d["hostPath"])
        for dev in spec["devices"]
        for d in dev["containerEdits"].get("deviceNodes") or []
    ]
    assert nodes == [
        (f"/dev/davinci{vnpu.vnpu_id}", str(n.dirs["devroot"] / "dev" / f"vdavinci{vnpu.vnpu_id}"))
    ]
    shared = [d["path"] for d in spec["containerEdits"].get("deviceNodes") or []]
    assert shared == ["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]
    assert f"/dev/davinci{vnpu.phy_id}" not in {p for p, _ in nodes} | set(shared)  # nothing of the die
    mounts = {m["containerPath"] for m in spec["containerEdits"].get("mounts") or []}
    assert "/usr/local/Ascend/driver/lib64" in mounts
    assert f"FLEXNPU_VNPU_IDS={vnpu.vnpu_id}" in spec["containerEdits"]["env"]
    (status,) = wait_for(lambda: claim_doc(n, "hard")["status"].get("devices"), what="claim status")
    assert status["data"]["template"] == VNPU_TEMPLATE and status["data"]["vnpuID"] == vnpu.vnpu_id
    assert status["data"]["aicore"] == 10 and status["data"]["memoryBytes"] == 16 * 1024**3
    assert n.kubelet.prepare([ref])[ref.uid] == res  # idempotent: no second vNPU
    assert len(_vnpus(n)) == 1
    assert n.kubelet.unprepare([ref]) == {ref.uid: ""}
    assert _vnpus(n) == [] and not (n.dirs["devroot"] / "dev" / f"vdavinci{vnpu.vnpu_id}").exists()
    assert not n.cdi_specs()


def test_a_whole_die_claim_waits_while_a_template_lives(serving: Node) -> None:

    n = serving
    ref = _allocate(n, "hard", [template_request(VNPU_TEMPLATE)])
    assert n.kubelet is not None and n.kubelet.prepare([ref])[ref.uid].error == ""
    (vnpu,) = _vnpus(n)
    whole = {
        "name": "npu",
        "exactly": {
            "deviceClassName": "npu.flexnpu.io",
            "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].phyID == {vnpu.phy_id}'}}],
        },
    }
    n.create_claim("whole", [whole])
    with pytest.raises(Unschedulable):
        n.scheduler.allocate(NAMESPACE, "whole", NODE)
    assert n.kubelet.unprepare([ref]) == {ref.uid: ""}
    n.scheduler.deallocate(NAMESPACE, "hard")
    result = n.scheduler.allocate(NAMESPACE, "whole", NODE)["status"]["allocation"]["devices"]["results"]
    assert result[0]["device"] == f"npu-{vnpu.phy_id}"


def test_flexnpu_smi_lists_the_hard_vnpu_with_its_owner(serving: Node) -> None:

    n = serving
    ref = _allocate(n, "hard", [template_request(VNPU_TEMPLATE)])
    assert n.kubelet is not None and n.kubelet.prepare([ref])[ref.uid].error == ""
    out = subprocess.run(
        [sys.executable, "-m", "kubeletplugin.smi", "info", "--json"],
        env=n.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    rows = [
        r for r in json.loads(out.stdout)["rows"] if r["MODE"] == "hard" and r["DEVICE"].startswith("vnpu ")
    ]
    (row,) = rows
    assert row["CLAIM UID"] == ref.uid and VNPU_TEMPLATE in row["DEVICE"] and row["RESIDUAL"] == "no"


# -- crash and reboot leave no vNPU behind ------------------------------------------------------


def _ledger(node: Node) -> dict[int, str] | None:
    return ownership.load(node.dirs["state"])


def _restart(node: Node, failpoint: str | None = None) -> None:
    node.stop()
    node.env.pop("FLEXNPU_FAILPOINTS", None)
    if failpoint:
        node.env["FLEXNPU_FAILPOINTS"] = failpoint
    node.start()


@pytest.mark.parametrize(
    "point",
    [
        "prepare-after-intent",
        "prepare-after-hard-vnpu",
        "prepare-after-cdi",
        "prepare-after-complete",
        "unprepare-after-intent",
        "unprepare-after-hard-vnpu",
    ],
)
def test_a_crash_at_any_step_leaves_no_vnpu(serving: Node, point: str) -> None:
    n = serving
    _restart(n, point)
    ref = _allocate(n, "hard", [template_request(VNPU_TEMPLATE)])
    assert n.kubelet is not None
    if point.startswith("prepare"):
        with pytest.raises(KubeletError):
            n.kubelet.prepare([ref])
    else:
        assert n.kubelet.prepare([ref])[ref.uid].error == ""
        with pytest.raises(KubeletError):
            n.kubelet.unprepare([ref])
    assert n.proc is not None
    proc = n.proc
    wait_for(lambda: proc.poll() is not None, what="the node process to die")
    assert len(_vnpus(n)) <= 1
    _restart(n)
    # the kubelet retries: one vNPU, the same one, then unprepare removes it
    assert n.kubelet is not None
    assert n.kubelet.prepare([ref])[ref.uid].error == ""
    assert len(_vnpus(n)) == 1
    assert n.kubelet.unprepare([ref]) == {ref.uid: ""}
    assert _vnpus(n) == [] and _ledger(n) == {} and not n.cdi_specs()


def test_a_claim_deleted_while_the_node_is_down_loses_its_vnpu(serving: Node) -> None:
    n = serving
    ref = _allocate(n, "hard", [template_request(VNPU_TEMPLATE)])
    assert n.kubelet is not None and n.kubelet.prepare([ref])[ref.uid].error == ""
    n.stop()
    n.resource.delete_namespaced_resource_claim("hard", NAMESPACE, _preload_content=False)
    n.start()
    wait_for(
        lambda: _vnpus(n) == [] and _ledger(n) == {}, what="the reconciler to destroy the vNPU", timeout=30
    )
    assert not n.cdi_specs()


def test_reboot_remakes_the_vnpu_of_a_claim_still_in_use(serving: Node) -> None:
    n = serving
    ref = _allocate(n, "hard", [template_request(VNPU_TEMPLATE)])
    other = _allocate(n, "other", [template_request(VNPU_TEMPLATE)])
    assert n.kubelet is not None
    first = n.kubelet.prepare([ref])[ref.uid]
    assert first.error == "" and n.kubelet.prepare([other])[other.uid].error == ""
    before = sorted(v.vnpu_id for v in _vnpus(n))
    # power loss: the node dies, the HDK forgets its vNPUs (no vnpu-cfg-recover), tmpfs is empty
    n.stop()
    (n.dirs["devroot"] / "var" / "lib" / "flexnpu-hdk" / "vnpus.json").unlink()
    for vid in before:
        (n.dirs["devroot"] / "dev" / f"vdavinci{vid}").unlink()
    for p in n.cdi_specs():
        p.unlink()
    with CheckpointStore(n.dirs["state"] / "checkpoint.json").locked() as cp:
        cp.boot_id = str(uuid.uuid4())
    n.start()
    n.resource.delete_namespaced_resource_claim("other", NAMESPACE, _preload_content=False)
    assert n.kubelet is not None
    assert n.kubelet.prepare([ref])[ref.uid] == first  # the pod restarts: its vNPU is made again
    wait_for(
        lambda: len(_vnpus(n)) == 1 and len(_ledger(n) or {}) == 1,
        what="only the surviving claim's vNPU",
        timeout=30,
    )
    (vnpu,) = _vnpus(n)
    assert vnpu.vnpu_id in before and (n.dirs["devroot"] / "dev" / f"vdavinci{vnpu.vnpu_id}").exists()
    assert n.kubelet.unprepare([ref]) == {ref.uid: ""}
    assert _vnpus(n) == [] and _ledger(n) == {}


# -- a damaged record, adopt, a reboot: the template claim gets its vNPU again, never the die ----


@pytest.fixture
def operated(hard_node: Callable[..., Node]) -> Node:
    """A serving node with its flexnpu-daemon, as on a real node (``flexnpu-smi adopt`` asks it)."""
    n = hard_node(
        daemon=True, FLEXNPU_RECONCILE_PERIOD_SECONDS="1", FLEXNPU_RESIDUAL_GRACE_SECONDS="2"
    ).start()
    wait_for(n.devices, what="published devices")
    return n


def _reboot(node: Node) -> None:
    """Power loss: the HDK forgets its vNPUs (no vnpu-cfg-recover), tmpfs is empty, the boot ID changes."""
    node.stop()
    (node.dirs["devroot"] / "var" / "lib" / "flexnpu-hdk" / "vnpus.json").unlink()
    for p in (node.dirs["devroot"] / "dev").glob("vdavinci*"):
        p.unlink()
    for p in node.cdi_specs():
        p.unlink()
    with CheckpointStore(node.dirs["state"] / "checkpoint.json").locked() as cp:
        cp.boot_id = str(uuid.uuid4())
    node.start()


def _device_nodes(spec: dict[str, Any]) -> list[tuple[str, str]]:
    edits = [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]
    return [(n["path"], n.get("hostPath", n["path"])) for e in edits for n in e.get("deviceNodes") or []]


def _assert_only_the_vnpu(node: Node, uid: str, vnpu_id: int, phy: int) -> None:
    nodes = _device_nodes(_spec(node, uid))
    assert (f"/dev/davinci{vnpu_id}", str(node.dirs["devroot"] / "dev" / f"vdavinci{vnpu_id}")) in nodes
    physical = f"/dev/davinci{phy}"
    assert not [n for n in nodes if n[0] == physical or n[1].endswith(physical)], nodes  # nothing of the die


def test_an_adopted_template_claim_gets_its_vnpu_after_a_reboot_never_the_die(operated: Node) -> None:
    n = operated
    ref = _allocate(n, "hard", [template_request(VNPU_TEMPLATE)])
    assert n.kubelet is not None and n.kubelet.prepare([ref])[ref.uid].error == ""
    (vnpu,) = _vnpus(n)
    assert (vnpu.phy_id, vnpu.vnpu_id) == (7, 212)  # first fit: die 7's templates come first
    # the claim's checkpoint record is damaged; the node doubts, then the operator adopts
    n.stop()
    record = n.dirs["state"] / "checkpoint.json" / f"{ref.uid}.json"
    raw = record.read_bytes()
    record.write_bytes(raw[: len(raw) // 2] + b"\x00\xff garbage")
    n.start()
    wait_for(lambda: "store is not trusted" in n.log(), timeout=30, what="a refused pass")
    res = smi(n, "adopt")
    assert res.returncode == 0 and f"adopted claim {ref.uid}" in res.stdout, res.stdout + res.stderr
    entry = CheckpointStore(n.dirs["state"] / "checkpoint.json").get(ref.uid)
    assert entry is not None
    assert [e.ref for e in entry.effect(EffectKind.HARD_VNPU)] == ["212"]  # rebuilt from the ledger
    assert _vnpus(n) == [vnpu] and _ledger(n) == {212: ref.uid}
    # a reboot drops the vNPU and the CDI spec; the kubelet prepares the claim again
    _reboot(n)
    assert n.kubelet is not None
    assert n.kubelet.prepare([ref])[ref.uid].error == ""
    assert [(v.vnpu_id, v.template) for v in _vnpus(n)] == [(212, VNPU_TEMPLATE)]  # made again
    _assert_only_the_vnpu(n, ref.uid, 212, vnpu.phy_id)
    # the die's other template slots stay the scheduler's to give: the vNPU holds its counters
    assert n.kubelet.unprepare([ref]) == {ref.uid: ""}
    assert _vnpus(n) == [] and _ledger(n) == {} and not n.cdi_specs()


def test_adopt_without_evidence_of_the_vnpu_leaves_the_claim_to_the_sweep(operated: Node) -> None:
    n = operated
    ref = _allocate(n, "hard", [template_request(VNPU_TEMPLATE)])
    assert n.kubelet is not None and n.kubelet.prepare([ref])[ref.uid].error == ""
    (vnpu,) = _vnpus(n)
    n.stop()
    record = n.dirs["state"] / "checkpoint.json" / f"{ref.uid}.json"
    record.write_bytes(b"{ not json")
    (n.dirs["state"] / ownership.FILE_NAME).write_text("{}")  # the proof of ownership is gone too
    n.start()
    wait_for(lambda: "store is not trusted" in n.log(), timeout=30, what="a refused pass")
    res = smi(n, "adopt")
    assert res.returncode == 0 and f"adopted claim {ref.uid}" not in res.stdout, res.stdout + res.stderr
    assert CheckpointStore(n.dirs["state"] / "checkpoint.json").get(ref.uid) is None  # no wrong shape
    # the CDI spec that only the lost record owned goes; the vNPU nobody can prove is the driver's stays
    wait_for(lambda: not n.cdi_specs(), timeout=30, what="the orphan CDI spec removed")
    assert _vnpus(n) == [vnpu]
    # the kubelet's repeat prepare makes the claim a vNPU of its own, never the physical die
    res2 = n.kubelet.prepare([ref])[ref.uid]
    assert res2.error == "", res2.error
    (made,) = [v for v in _vnpus(n) if v.vnpu_id != vnpu.vnpu_id]
    _assert_only_the_vnpu(n, ref.uid, made.vnpu_id, made.phy_id)
    assert n.kubelet.unprepare([ref]) == {ref.uid: ""}
    assert _vnpus(n) == [vnpu]  # kept: doubt keeps things


def test_an_entry_recorded_without_its_vnpu_is_prepared_again(serving: Node) -> None:
    n = serving
    ref = _allocate(n, "hard", [template_request(VNPU_TEMPLATE)])
    assert n.kubelet is not None and n.kubelet.prepare([ref])[ref.uid].error == ""
    (vnpu,) = _vnpus(n)
    # what an earlier release's adopt recorded: the CDI spec and the claim status, no vNPU
    store = CheckpointStore(n.dirs["state"] / "checkpoint.json")
    entry = store.get(ref.uid)
    assert entry is not None
    shapeless = dataclasses.replace(
        entry, effects=tuple(e for e in entry.effects if e.kind != EffectKind.HARD_VNPU)
    )
    store.update(ref.uid, lambda _: shapeless)
    _reboot(n)
    assert n.kubelet.prepare([ref])[ref.uid].error == ""
    (made,) = _vnpus(n)
    assert made.template == VNPU_TEMPLATE and made.phy_id == vnpu.phy_id
    _assert_only_the_vnpu(n, ref.uid, made.vnpu_id, made.phy_id)
    again = store.get(ref.uid)
    assert again is not None and [e.ref for e in again.effect(EffectKind.HARD_VNPU)] == [str(made.vnpu_id)]
    assert n.kubelet.unprepare([ref]) == {ref.uid: ""}
    assert _vnpus(n) == [] and not n.cdi_specs()
