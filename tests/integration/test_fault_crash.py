"""Crash, reboot and bad-checkpoint faults of the claim lifecycle, with real processes.

The node process is SIGKILLed (``dra_driver.failpoints``) after every recorded step of
prepare and of unprepare; the node is "rebooted" (every process killed, the tmpfs state
wiped, a new boot ID); the checkpoint is corrupt, truncated or from a future version at
start. Each scenario ends with a clean node (:func:`assert_clean`) and the surviving claims
still working. The golden-file table checks that every checkpoint version ever written
still decodes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_driver import checkpoint, failpoints, wirefiles
from dra_driver.checkpoint import (
    Checkpoint,
    CheckpointStore,
    ClaimEntry,
    ClaimState,
    DieRecord,
    Effect,
    EffectKind,
    Registration,
    StatusRecord,
)
from dra_driver.daemon_api.values import Endpoints
from dra_driver.devices import DieMode
from dra_kubeletplugin.claims import ClaimRef, PreparedDevice
from dra_kubeletplugin.claims import PrepareResult as ClaimResult
from flexnpu_client.session import Session
from flexnpu_runtime.daemon import shmfs
from flexnpu_testing.kubelet import KubeletError, PluginHandle
from flexnpu_testing.waiting import wait_for
from flexnpu_wire.shares import Share
from tests.integration.conftest import NAMESPACE, NODE, Node
from tests.integration.lifecycle_helpers import (
    assert_clean,
    assert_share_works,
    claim_doc,
    pod_ref,
    share_request,
    smi,
)

SHARE = [share_request()]
WHOLE = [{"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}]
MIB = 1024 * 1024
GOLDEN_DIR = Path(__file__).resolve().parents[1] / "data" / "checkpoint"


@pytest.fixture
def fault_node(node_factory: Callable[..., Node]) -> Node:
    """A node with a daemon and a fast reconciler (1 s period, 2 s grace), serving."""
    n = node_factory(
        daemon=True,
        FLEXNPU_DEFAULT_MODE="both",
        FLEXNPU_DAEMON_RETRY_SECONDS="2",
        FLEXNPU_RECONCILE_PERIOD_SECONDS="1",
        FLEXNPU_RESIDUAL_GRACE_SECONDS="2",
    ).start()
    wait_for(n.devices, what="published devices")
    return n


def _kubelet(node: Node) -> PluginHandle:
    assert node.kubelet is not None
    return node.kubelet


def _allocate(node: Node, name: str, requests: list[dict[str, Any]]) -> ClaimRef:
    """Create the claim and allocate it here, reserved for a (running) pod."""
    uid = node.create_claim(name, requests)
    node.scheduler.allocate(NAMESPACE, name, NODE, reserved_for=[pod_ref(f"pod-{name}")])
    return ClaimRef(NAMESPACE, uid, name)


def _prepare_ok(node: Node, ref: ClaimRef) -> ClaimResult:
    res = _kubelet(node).prepare([ref])[ref.uid]
    assert res.error == "" and res.devices, res
    return res


def _restart(node: Node, failpoint: str | None = None) -> None:
    """Stop the node (SIGTERM if it still runs), arm or disarm a failpoint, start it again."""
    node.stop()
    node.env.pop("FLEXNPU_FAILPOINTS", None)
    if failpoint:
        node.env["FLEXNPU_FAILPOINTS"] = failpoint
    node.start()


def _expect_killed(node: Node, call: Callable[[], object]) -> None:
    """``call`` makes the node kill itself at the armed failpoint: the kubelet's call fails."""
    with pytest.raises(KubeletError):
        call()
    assert node.proc is not None
    proc = node.proc
    wait_for(lambda: proc.poll() is not None, what="the node process to die")
    assert node.stop() == -signal.SIGKILL, node.log()[-3000:]


def _endpoint_of(node: Node, ref: ClaimRef) -> tuple[str, str]:
    """What claim ``ref``'s status should say: Ready, at client.conf's TCP endpoint."""
    conf = wirefiles.load_client_conf(node.dirs["run"] / "claims" / ref.uid / "client.conf")
    return ("True", str(conf.endpoints.tcp))


def _status_of(node: Node, ref: ClaimRef) -> tuple[str, str] | None:
    (dev,) = claim_doc(node, ref.name)["status"].get("devices") or [None]
    if dev is None:
        return None
    return (dev["conditions"][0]["status"], str(dev["data"].get("endpoint")))


def _client_sees_its_quota(node: Node, ref: ClaimRef) -> None:
    """The client library, with the claim's client.conf and the shm dir its CDI spec mounts,
    talks to its aclserver over TCP."""
    conf = wirefiles.load_client_conf(node.dirs["run"] / "claims" / ref.uid / "client.conf")
    (spec,) = [json.loads(p.read_text()) for p in node.cdi_specs() if ref.uid in p.name]
    (shm,) = [m["hostPath"] for m in spec["containerEdits"]["mounts"] if m["containerPath"] == conf.shm_dir]
    with Session.open(dataclasses.replace(conf, shm_dir=shm), prefer="tcp") as s:
        s.init()
        s.set_device(0)
        assert s.get_mem_info()[1] == 256 * MIB


def _delete_claim(node: Node, ref: ClaimRef) -> None:
    node.resource.delete_namespaced_resource_claim(ref.name, NAMESPACE, _preload_content=False)


# -- SIGKILL at every step ---------------------------------------------------------------------


@dataclass(frozen=True)
class AfterCrash:
    """What a crash at a point leaves for claim B (proves the point is where its name says)."""

    state: ClaimState  # B's checkpoint entry
    conf: bool  # client.conf written
    cdi: bool  # CDI spec written
    aclserver: bool  # registered with the daemon
    status: bool  # device status in the API


_STARTED, _DONE, _UNDOING = (
    ClaimState.PREPARE_STARTED,
    ClaimState.PREPARE_COMPLETED,
    ClaimState.UNPREPARE_STARTED,
)
AFTER = {
    "prepare-after-intent": AfterCrash(_STARTED, conf=False, cdi=False, aclserver=False, status=False),
    "prepare-after-register": AfterCrash(_STARTED, conf=False, cdi=False, aclserver=True, status=False),
    "prepare-after-client-conf": AfterCrash(_STARTED, conf=True, cdi=False, aclserver=True, status=False),
    "prepare-after-cdi": AfterCrash(_STARTED, conf=True, cdi=True, aclserver=True, status=False),
    "prepare-after-complete": AfterCrash(_DONE, conf=True, cdi=True, aclserver=True, status=False),
    "unprepare-after-intent": AfterCrash(_UNDOING, conf=True, cdi=True, aclserver=True, status=True),
    "unprepare-after-claim-status": AfterCrash(_UNDOING, conf=True, cdi=True, aclserver=True, status=False),
    "unprepare-after-cdi-spec": AfterCrash(_UNDOING, conf=True, cdi=False, aclserver=True, status=False),
    "unprepare-after-client-conf": AfterCrash(_UNDOING, conf=False, cdi=False, aclserver=True, status=False),
    "unprepare-after-daemon-registration": AfterCrash(
        _UNDOING, conf=False, cdi=False, aclserver=False, status=False
    ),
}


def test_every_failpoint_has_an_expected_crash_state() -> None:
    assert set(AFTER) == set(failpoints.POINTS)


def _check_after_crash(node: Node, ref: ClaimRef, want: AfterCrash) -> None:
    entry = CheckpointStore(node.dirs["state"] / "checkpoint.json").read().claims.get(ref.uid)
    assert entry is not None and entry.state == want.state
    assert bool(claim_doc(node, ref.name)["status"].get("devices")) == want.status
    assert (node.dirs["run"] / "claims" / ref.uid / "client.conf").exists() == want.conf
    assert any(ref.uid in p.name for p in node.cdi_specs()) == want.cdi
    assert node.daemon is not None
    with node.daemon.client(timeout=10) as c:
        assert any(e.entity_id == ref.uid for e in c.list()) == want.aclserver


# Every prepare point with the kubelet retrying; the claim deleted instead for one interrupted
# (PrepareStarted, aclserver running) and one completed entry (the residual path): the rest of
# the deleted variants repeat the interrupted rollback, and each case restarts the node twice.
DELETED_AT = ("prepare-after-register", "prepare-after-complete")
PREPARE_CASES = [
    pytest.param(point, mode, id=f"{point}-{mode}")
    for point in failpoints.POINTS
    if point.startswith("prepare-")
    for mode in ("retry", "deleted")
    if mode == "retry" or point in DELETED_AT
]


@pytest.mark.parametrize(("point", "mode"), PREPARE_CASES)
def test_crash_during_prepare(fault_node: Node, point: str, mode: str) -> None:
    """retry: the kubelet prepares B again and it works; deleted: B's pod and claim are gone and
    the reconciler removes everything of B. A, prepared before, works throughout."""
    n = fault_node
    a = _allocate(n, "a", SHARE)
    _prepare_ok(n, a)
    _restart(n, failpoint=point)
    b = _allocate(n, "b", SHARE)
    _expect_killed(n, lambda: _kubelet(n).prepare([b]))
    _check_after_crash(n, b, AFTER[point])
    _restart(n)
    if mode == "retry":
        _prepare_ok(n, b)
        assert_share_works(n, b.uid)
        assert _status_of(n, b) == _endpoint_of(n, b)
        assert _kubelet(n).unprepare([b]) == {b.uid: ""}
        assert _status_of(n, b) is None
    else:
        _delete_claim(n, b)
    assert_share_works(n, a.uid)
    assert_clean(n, {a.uid})


UNPREPARE_CASES = [pytest.param(p, id=p) for p in failpoints.POINTS if p.startswith("unprepare-")]


@pytest.mark.parametrize("point", UNPREPARE_CASES)
def test_crash_during_unprepare(fault_node: Node, point: str) -> None:
    n = fault_node
    a = _allocate(n, "a", SHARE)
    _prepare_ok(n, a)
    b = _allocate(n, "b", SHARE)
    _prepare_ok(n, b)
    _restart(n, failpoint=point)
    _expect_killed(n, lambda: _kubelet(n).unprepare([b]))
    _check_after_crash(n, b, AFTER[point])
    _restart(n)
    assert _kubelet(n).unprepare([b]) == {b.uid: ""}
    assert _status_of(n, b) is None
    assert_share_works(n, a.uid)
    assert_clean(n, {a.uid})


# -- reboot ------------------------------------------------------------------------------------


def _empty(directory: Path) -> None:
    shmfs.unmount_all_under(directory)  # a reboot also drops the claims' own shm tmpfs mounts
    for p in directory.iterdir():
        if os.path.ismount(p):  # a claim's own shm tmpfs: a reboot drops the mount
            subprocess.run(["umount", "-l", str(p)], check=True)
        if p.is_dir() and not p.is_symlink():
            _rmtree(p)
        else:
            p.unlink()


def _rmtree(d: Path) -> None:
    _empty(d)
    d.rmdir()


@pytest.mark.root
def test_reboot_restores_running_claims_and_drops_the_rest(fault_node: Node) -> None:
    n = fault_node
    d = n.daemon
    assert d is not None
    a, b, c = _allocate(n, "a", SHARE), _allocate(n, "b", SHARE), _allocate(n, "c", WHOLE)
    first = {ref.uid: _prepare_ok(n, ref) for ref in (a, b, c)}
    old_pid = assert_share_works(n, a.uid)

    # power loss: every process dies, tmpfs is empty, the boot ID changes; disk state survives
    n.stop(signal.SIGKILL)
    d.stop(signal.SIGKILL)
    for pid in d.aclserver_pids():
        os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: not d.aclserver_pids(), what="aclservers gone")
    for tmpfs in (n.dirs["cdi"], n.dirs["run"], d.shm_root, d.run_dir):
        _empty(tmpfs)
    with CheckpointStore(n.dirs["state"] / "checkpoint.json").locked() as cp:
        assert set(cp.claims) == {a.uid, b.uid, c.uid}
        cp.boot_id = str(uuid.uuid4())

    d.start()
    n.start()
    _delete_claim(n, b)  # its pod did not come back
    wait_for(
        lambda: (_status_of(n, a) or ("",))[0] == "False",
        what="claim a's status to say its aclserver is down",
    )
    for ref in (a, c):
        assert _kubelet(n).prepare([ref])[ref.uid] == first[ref.uid]
    assert assert_share_works(n, a.uid) != old_pid  # a new aclserver after the reboot
    _client_sees_its_quota(n, a)
    wait_for(
        lambda: _status_of(n, a) == _endpoint_of(n, a),
        what="claim a's status to name the new aclserver, Ready",
    )
    assert "rebooted" in n.log()
    assert_clean(n, {a.uid, c.uid})


# -- damaged checkpoint at start: nothing is removed, the node keeps serving --------------------


def _truncated(raw: bytes) -> bytes:
    return raw[: len(raw) // 2]


def _corrupt(raw: bytes) -> bytes:
    mid = len(raw) // 2
    return raw[:mid] + b"\x00\xff garbage \xff\x00" + raw[mid + 16 :]


def _future(raw: bytes) -> bytes:
    doc = json.loads(raw)
    doc["version"] = checkpoint.VERSION + 1
    return json.dumps(doc).encode()


def _wrong_shape(raw: bytes) -> bytes:
    doc = json.loads(raw)
    body = {**doc["entry"], "dies": [{"phy": "seven", "mode": "sideways"}]}
    return json.dumps(
        {"version": doc["version"], "checksum": checkpoint._checksum(body), "entry": body}
    ).encode()


def _spoil_record(path: Path, uid: str, spoil: Callable[[bytes], bytes]) -> bytes:
    rec = path / f"{uid}.json"
    bad = spoil(rec.read_bytes())
    rec.write_bytes(bad)
    return bad


def _spoil_as_v1(path: Path, uid: str, spoil: Callable[[bytes], bytes]) -> bytes:
    """The checkpoint as the previous release wrote it (one version-1 file), then damaged."""
    with CheckpointStore(path).locked() as cp:
        raw = checkpoint.encode(cp)
    for p in path.iterdir():
        p.unlink()
    path.rmdir()
    doc = json.loads(raw)
    bad = spoil(raw) if spoil is not _future else json.dumps({**doc, "version": 3}).encode()
    path.write_bytes(bad)
    return bad


DAMAGE = [
    pytest.param(_spoil_record, _corrupt, id="record-corrupt"),
    pytest.param(_spoil_record, _truncated, id="record-truncated"),
    pytest.param(_spoil_record, _wrong_shape, id="record-wrong-shape"),
    pytest.param(_spoil_record, _future, id="record-newer-version"),
    pytest.param(_spoil_as_v1, _corrupt, id="v1-file-corrupt"),
    pytest.param(_spoil_as_v1, _truncated, id="v1-file-truncated"),
    pytest.param(_spoil_as_v1, _future, id="v1-file-newer-version"),
]


@pytest.mark.parametrize(("where", "spoil"), DAMAGE)
def test_damaged_checkpoint_removes_nothing_and_the_node_keeps_serving(
    fault_node: Node,
    where: Callable[[Path, str, Callable[[bytes], bytes]], bytes],
    spoil: Callable[[bytes], bytes],
) -> None:
    n = fault_node
    a = _allocate(n, "a", SHARE)
    _prepare_ok(n, a)
    a_pid = assert_share_works(n, a.uid)
    n.stop()
    bad = where(n.dirs["state"] / "checkpoint.json", a.uid, spoil)

    n.start()
    # two reconcile passes ran (1 s period) and each refused to remove anything
    wait_for(lambda: n.log().count("store is not trusted") >= 2, what="two refused passes", timeout=30)
    assert assert_share_works(n, a.uid) == a_pid  # A's aclserver, CDI spec and client.conf survive
    events = json.loads(n.api_core().list_namespaced_event("default", _preload_content=False).data)["items"]
    untrusted = [e for e in events if e["reason"] == "FlexNPUCheckpointUntrusted"]
    assert len(untrusted) == 1, untrusted  # reported on the Node once, not once per pass
    assert untrusted[0]["involvedObject"]["kind"] == "Node" and "flexnpu-smi adopt" in untrusted[0]["message"]
    assert any(p.read_bytes() == bad for p in n.dirs["state"].rglob("*") if p.is_file())  # kept
    assert n.slices()  # publishes
    d = _allocate(n, "d", SHARE)
    _prepare_ok(n, d)  # and serves new claims
    assert_share_works(n, d.uid)

    # the operator adopts what the node holds: A is recorded again from the evidence and the API
    res = smi(n, "adopt")
    assert res.returncode == 0 and f"adopted claim {a.uid}" in res.stdout, res.stdout + res.stderr
    assert _prepare_ok(n, a).devices  # the kubelet's repeat prepare finds it prepared
    assert assert_share_works(n, a.uid) == a_pid
    _client_sees_its_quota(n, a)
    assert_clean(n, {a.uid, d.uid})  # the reconciler runs again and removes nothing live
    assert _kubelet(n).unprepare([a]) == {a.uid: ""}
    assert_clean(n, {d.uid})


def test_discarding_a_damaged_record_makes_its_effects_orphans(fault_node: Node) -> None:
    n = fault_node
    a = _allocate(n, "a", SHARE)
    _prepare_ok(n, a)
    a_pid = assert_share_works(n, a.uid)
    n.stop()
    _spoil_record(n.dirs["state"] / "checkpoint.json", a.uid, _corrupt)
    n.start()
    wait_for(lambda: "store is not trusted" in n.log(), what="a refused pass", timeout=30)
    info = json.loads(smi(n, "info", "--json").stdout)
    assert info["checkpointTrusted"] is False and a.uid in " ".join(info["checkpointDoubts"])
    res = smi(n, "discard")
    assert res.returncode == 0 and "damaged record kept at" in res.stdout, res.stdout + res.stderr
    assert_clean(n, set())  # the operator said so: A's aclserver, CDI spec and client.conf go
    assert n.daemon is not None and a_pid not in n.daemon.aclserver_pids()


# -- every checkpoint version ever written still decodes -----------------------------------------

WHOLE_UID = "1c8d63b5-4a2f-4e8f-8b72-6d3a9f5c2b02"
SHARE_UID = "0b7c52a4-3f1e-4d7e-9a61-5c2f8e4b1a01"
STARTED_UID = "2d9e74c6-5b3a-4f9a-9c83-7e4bafc63c03"
SHARE_ID = "c2351f00-cf71-4d26-83e8-127579900b36"
STARTED_SHARE_ID = "d3462a11-da82-4e37-94f9-238680a11c47"
CDI = "/var/run/cdi/flexnpu.io-vnpu_"
CLAIMS = "/var/run/flexnpu/claims/"


def _ready(device: str, data: dict[str, Any], **extra: Any) -> dict[str, Any]:
    cond = {
        "type": "Ready",
        "status": "True",
        "reason": "Prepared",
        "message": "prepared on node node-a",
        "lastTransitionTime": "2026-11-30T11:44:27Z",
    }
    return {
        "driver": "npu.flexnpu.io",
        "pool": "node-a",
        "device": device,
        **extra,
        "data": data,
        "conditions": [cond],
    }


def _share(vid: int, phy: int, policy: str) -> Share:
    return Share(
        virtual_id=vid,
        die_phy_id=phy,
        memory_bytes=268435456,
        compute_percent=10,
        policy=policy,
        memory_only=False,
    )


def _status(uid: str, *docs: dict[str, Any]) -> Effect:
    return Effect(EffectKind.CLAIM_STATUS, uid, StatusRecord(devices=docs))


GOLDEN_V1 = Checkpoint(
    boot_id="6a1f0d2c-8f4b-4b8e-a5e1-3c9d7e2f4a10",
    claims={
        WHOLE_UID: ClaimEntry(
            uid=WHOLE_UID,
            namespace="team-a",
            name="whole",
            state=ClaimState.PREPARE_COMPLETED,
            devices=(
                PreparedDevice(
                    request_names=("npu",),
                    pool="node-a",
                    device="npu-0",
                    cdi_device_ids=(f"flexnpu.io/vnpu={WHOLE_UID}-npu-0",),
                ),
            ),
            effects=(
                Effect(EffectKind.CDI_SPEC, f"{CDI}{WHOLE_UID}.json"),
                _status(
                    WHOLE_UID,
                    _ready(
                        "npu-0",
                        {
                            "die": 0,
                            "vdieID": "6E9CDD8A-ED95D381-7C09AFF4-E12B1FDA-9FBA2226",
                            "model": "910B4",
                            "mode": "whole",
                            "cdiDeviceIDs": [f"flexnpu.io/vnpu={WHOLE_UID}-npu-0"],
                        },
                    ),
                ),
            ),
            dies=(DieRecord(phy=0, mode=DieMode.WHOLE, device="npu-0", share_id=None),),
            updated_at=1796039067.6157975,
        ),
        SHARE_UID: ClaimEntry(
            uid=SHARE_UID,
            namespace="team-a",
            name="share",
            state=ClaimState.PREPARE_COMPLETED,
            devices=(
                PreparedDevice(
                    request_names=("vnpu",),
                    pool="node-a",
                    device="vnpu-7",
                    share_id=SHARE_ID,
                    cdi_device_ids=(f"flexnpu.io/vnpu={SHARE_UID}-vnpu-7-{SHARE_ID}",),
                ),
            ),
            effects=(
                Effect(
                    EffectKind.DAEMON_REGISTRATION,
                    SHARE_UID,
                    Registration(
                        token="3594e824949d79f7a320bcb1a6575df3218b16054802d82e085f2fdabf999497",
                        shares=(_share(0, 7, "elastic"),),
                        endpoints=Endpoints(
                            shm_dir=f"/dev/shm/flexnpu/{SHARE_UID}",
                            tcp_host="169.254.213.1",
                            tcp_port=44051,
                            unix_socket=f"/dev/shm/flexnpu/{SHARE_UID}/aclserver.sock",
                        ),
                        pid=21230,
                    ),
                ),
                Effect(EffectKind.CLIENT_CONF, f"{CLAIMS}{SHARE_UID}"),
                Effect(EffectKind.CDI_SPEC, f"{CDI}{SHARE_UID}.json"),
                _status(
                    SHARE_UID,
                    _ready(
                        "vnpu-7",
                        {
                            "die": 7,
                            "vdieID": "9707DC4A-90B0EDAB-8350426A-78CD8477-9220354A",
                            "model": "910B4",
                            "mode": "soft",
                            "virtualID": 0,
                            "memoryBytes": 268435456,
                            "computePercent": 10,
                            "policy": "elastic",
                            "memoryOnly": False,
                            "endpoint": "169.254.213.1:44051",
                            "cdiDeviceIDs": [f"flexnpu.io/vnpu={SHARE_UID}-vnpu-7-{SHARE_ID}"],
                        },
                        shareID=SHARE_ID,
                        networkData={"interfaceName": "flexnpu0", "ips": ["169.254.213.1/24"]},
                    ),
                ),
            ),
            dies=(DieRecord(phy=7, mode=DieMode.SOFT, device="vnpu-7", share_id=SHARE_ID, policy="elastic"),),
            updated_at=1796039067.4020314,
        ),
        STARTED_UID: ClaimEntry(
            uid=STARTED_UID,
            namespace="team-b",
            name="half-done",
            state=ClaimState.PREPARE_STARTED,
            effects=(
                Effect(
                    EffectKind.DAEMON_REGISTRATION,
                    STARTED_UID,
                    Registration(token="9f" * 32, shares=(_share(0, 7, "elastic"), _share(1, 6, "elastic"))),
                ),
                Effect(EffectKind.CLIENT_CONF, f"{CLAIMS}{STARTED_UID}"),
                Effect(EffectKind.CDI_SPEC, f"{CDI}{STARTED_UID}.json"),
            ),
            dies=(
                DieRecord(
                    phy=7, mode=DieMode.SOFT, device="vnpu-7", share_id=STARTED_SHARE_ID, policy="elastic"
                ),
                DieRecord(phy=6, mode=DieMode.SOFT, device="vnpu-6", share_id=None, policy="elastic"),
            ),
            updated_at=1796039070.25,
        ),
    },
)

# One row per file in tests/data/checkpoint: a new checkpoint version keeps the old files and
# adds its own v<N>-*.json (written by the code of that version) with the object it must decode to.
# Version 1 is one file for the node; version 2 is one record file per claim.
GOLDEN: dict[str, Checkpoint | ClaimEntry] = {
    "v1-representative.json": GOLDEN_V1,
    "v2-record-whole.json": GOLDEN_V1.claims[WHOLE_UID],
    "v2-record-share.json": GOLDEN_V1.claims[SHARE_UID],
    "v2-record-started.json": GOLDEN_V1.claims[STARTED_UID],
}


def _golden_rows() -> list[Any]:
    return [pytest.param(name, want, id=name) for name, want in sorted(GOLDEN.items())]


def test_every_golden_file_has_a_row() -> None:
    assert sorted(p.name for p in GOLDEN_DIR.glob("*.json")) == sorted(GOLDEN)


@pytest.mark.parametrize(("name", "want"), _golden_rows())
def test_checkpoint_written_by_an_earlier_version_decodes(name: str, want: Checkpoint | ClaimEntry) -> None:
    raw = (GOLDEN_DIR / name).read_bytes()
    if isinstance(want, ClaimEntry):
        entry = checkpoint.decode_record(raw, source=name)
        assert entry == want
        assert checkpoint.decode_record(checkpoint.encode_record(entry), source=name) == entry
        return
    got = checkpoint.decode(raw, source=name)
    assert got.boot_id == want.boot_id
    assert sorted(got.claims) == sorted(want.claims)
    for uid, e in want.claims.items():
        assert got.claims[uid] == e, uid
    assert checkpoint.decode(checkpoint.encode(got)) == got  # and it is re-written losslessly


def test_a_version_1_checkpoint_migrates_to_records(tmp_path: Path) -> None:
    """The node of the previous release left its single file: the store reads it as records."""
    path = tmp_path / "checkpoint.json"
    path.write_bytes((GOLDEN_DIR / "v1-representative.json").read_bytes())
    store = CheckpointStore(path, boot_id="new-boot")
    got = store.read()
    assert got.boot_id == GOLDEN_V1.boot_id and got.claims == GOLDEN_V1.claims
    assert store.trusted and path.is_dir()
    for uid in GOLDEN_V1.claims:
        assert (
            checkpoint.decode_record((path / f"{uid}.json").read_bytes(), source=uid) == GOLDEN_V1.claims[uid]
        )
