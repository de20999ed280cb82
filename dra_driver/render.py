"""What a prepared claim looks like on the node and in the API: pure rendering from the plan.

:func:`render` turns a resolved :class:`~dra_driver.plan.ClaimPlan` and the aclserver's
endpoints (when the claim has shares) into everything the node writes for it: the CDI spec,
the devices returned to the kubelet, ``client.conf`` and the claim's device status documents.
What the container gets for each device is one dispatch over the three device kinds (whole
die, share, template), exhaustive, that refuses a device it cannot render truthfully: a
template device without its vNPU never renders to the physical die, a share without its
resolved shares never to nothing.
:func:`failure_status` and :func:`ready_status` build the other two status documents the
node writes (a failed prepare; an aclserver that went down or came back). :func:`planned`
(and :func:`intent`, which records it) says what a new prepare will make, in order, with the
claim's ``client.conf`` directory and CDI spec path computed once (:class:`NodeLayout`); they are
checked to stay inside their directories where they are written. Nothing here
touches the world: the caller says which driver mounts exist on this node and what time it
is, so the same input always renders the same output. ``kubeletplugin/execute.py`` writes
what this module returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, assert_never

from dra_driver import cdi, interposition
from dra_driver.daemon_api.values import Endpoints
from dra_driver.devices import DieMode
from dra_driver.discovery import node_files
from dra_driver.errors import ErrorCode, StateError
from dra_driver.plan import ClaimPlan, PlannedDevice
from dra_driver.records import (
    ClaimEntry,
    ClaimState,
    DieRecord,
    Effect,
    EffectKind,
    HardVnpuRecord,
    Registration,
)
from dra_driver.sharing import Transport
from dra_driver.vnpu.planning import HardVnpu
from dra_kubeletplugin.claims import PreparedDevice
from flexnpu_wire import clientconf

CONTAINER_CONF = "/etc/flexnpu/client.conf"
CONTAINER_SHM = "/dev/shm/flexnpu"
CONDITION_MESSAGE_MAX = 1024

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """Where this node puts a claim's files and what it calls itself (from the configuration)."""

    driver_name: str
    pool_name: str
    cdi_kind: cdi.Kind
    device_root: Path
    run_dir: Path
    control_link: str = ""
    control_cidr: str = ""
    client_library: Path = Path(interposition.CONTAINER_LIBRARY)  # host path of libascendcl.so
    cdi_dir: Path = Path("/var/run/cdi")

    def conf_dir(self, claim_uid: str) -> Path:
        """The claim's ``client.conf`` directory: computed here only, and checked to stay inside
        its root where it is written (``dra_driver/paths.py``'s :func:`~dra_driver.paths.contained`)."""
        return self.run_dir / "claims" / claim_uid

    def spec_path(self, claim_uid: str) -> Path:
        """The claim's CDI spec file: computed here only, checked where it is written (``cdi.write_spec``)."""
        return self.cdi_dir / cdi.spec_file_name(self.cdi_kind, claim_uid)


def planned(plan: ClaimPlan, *, layout: NodeLayout, token: str) -> tuple[Effect, ...]:
    """The effects a new prepare of ``plan`` makes, in order (recorded before the first is made;
    undo runs them backwards): its vNPUs, its aclserver's registration and ``client.conf`` when it
    has shares, its CDI spec."""
    uid = plan.ref.uid
    out: list[Effect] = [
        Effect(EffectKind.HARD_VNPU, str(v.vnpu_id), HardVnpuRecord(v.to_dict())) for v in plan.vnpus
    ]
    if plan.shares:
        out += [
            Effect(EffectKind.DAEMON_REGISTRATION, uid, Registration(token, plan.shares)),
            Effect(EffectKind.CLIENT_CONF, str(layout.conf_dir(uid))),
        ]
    out.append(Effect(EffectKind.CDI_SPEC, str(layout.spec_path(uid))))
    return tuple(out)


def intent(plan: ClaimPlan, dies: tuple[DieRecord, ...], *, layout: NodeLayout, token: str) -> ClaimEntry:
    """A new prepare's intent: the dies it will hold and every effect it will make, recorded
    (``PrepareStarted``) before the first is made."""
    ref = plan.ref
    return ClaimEntry(
        uid=ref.uid,
        namespace=ref.namespace,
        name=ref.name,
        state=ClaimState.PREPARE_STARTED,
        dies=dies,
        effects=planned(plan, layout=layout, token=token),
    )


@dataclass(frozen=True, slots=True)
class Rendered:
    """Everything the node writes for one prepared claim."""

    spec: cdi.Spec
    devices: tuple[PreparedDevice, ...]
    client_conf: clientconf.ClientConf | None  # None: no shares, no aclserver
    conf_dir: Path
    status: tuple[JSON, ...]


def render(
    plan: ClaimPlan,
    endpoints: Endpoints | None,
    *,
    layout: NodeLayout,
    token: str,
    driver_mounts: Sequence[str] = (),
    client_library: interposition.ClientLibrary | None = None,
    now: str,
) -> Rendered:
    """The claim's CDI spec, kubelet devices, client.conf and status (``endpoints``: the aclserver's).

    ``driver_mounts`` are the entries of ``node_files.DRIVER_MOUNTS`` present on this node;
    ``client_library`` is the node's ``libascendcl.so`` as probed (``dra_driver/interposition.py``).
    Raises InvalidInput when the claim's ``interposition`` cannot be served.
    """
    uid = plan.ref.uid
    conf_dir = layout.conf_dir(uid)
    cdi_devices: list[cdi.CDIDevice] = []
    prepared: list[PreparedDevice] = []
    for d in plan.devices:
        name = cdi.device_name(uid, d.device if not d.share_id else f"{d.device}-{d.share_id}")
        cdi_devices.append(cdi.CDIDevice(name=name, edits=device_edits(d, layout=layout, claim_uid=uid)))
        prepared.append(
            PreparedDevice(
                request_names=(d.request_name,),
                pool=d.pool,
                device=d.device,
                cdi_device_ids=(cdi.qualified_id(layout.cdi_kind, name),),
                share_id=d.share_id,
            )
        )
    spec = cdi.Spec(
        kind=layout.cdi_kind,
        devices=tuple(cdi_devices),
        edits=_shared_edits(plan, endpoints, layout, driver_mounts, client_library),
    )
    conf = _client_conf(plan, endpoints, token) if endpoints is not None and plan.shares else None
    status = _status(plan, prepared, endpoints, layout, now)
    return Rendered(spec=spec, devices=tuple(prepared), client_conf=conf, conf_dir=conf_dir, status=status)


def device_edits(d: PlannedDevice, *, layout: NodeLayout, claim_uid: str) -> cdi.Edits:
    """What the container gets for one device, by its kind; StateError for what cannot be rendered.

    whole -> the die's device node; share -> no device node (the aclserver serves it: environment
    only); template -> the vNPU's node ``/dev/vdavinci<id>`` as ``/dev/davinci<id>``, nothing of
    the physical die. Each kind must carry what it is rendered from, and nothing of another kind.
    """
    match d.mode:
        case DieMode.WHOLE:
            if d.shares or d.vnpu is not None:
                raise _refused(d, claim_uid, "a whole-die device that also carries shares or a vNPU")
            return cdi.whole_die_edits([d.die.device_node], device_root=layout.device_root)
        case DieMode.SOFT:
            if not d.shares or d.vnpu is not None:
                raise _refused(d, claim_uid, "a share device without its resolved shares")
            return cdi.Edits(env=tuple(f"FLEXNPU_VNPU_{sh.virtual_id}={d.device}" for sh in d.shares))
        case DieMode.HARD:
            if d.vnpu is None or d.shares:
                raise _refused(
                    d,
                    claim_uid,
                    "a template device without its vNPU (the physical die is never given for it)",
                )
            return _vnpu_edits(d.vnpu, device_root=layout.device_root)
        case DieMode.BOTH | DieMode.ALL:
            raise _refused(d, claim_uid, f"{d.mode!s} is how a die is published, not a kind of device")
        case _:  # pragma: no cover - mypy proves the match exhaustive
            assert_never(d.mode)


def _refused(d: PlannedDevice, claim_uid: str, what: str) -> StateError:
    return StateError(
        f"device {d.device} ({d.mode!s}) is not rendered: {what}",
        code=ErrorCode.INTERNAL,
        claim_uid=claim_uid,
        field=f"status.allocation.devices.results[{d.request}/{d.device}]",
    )


def _vnpu_edits(vnpu: HardVnpu, *, device_root: Path) -> cdi.Edits:
    """The vNPU's node only (the host ``vdavinci`` as the container ``davinci``)."""
    return cdi.Edits(
        env=(f"FLEXNPU_VNPU_TEMPLATE_{vnpu.vnpu_id}={vnpu.template.name}",),
        device_nodes=(
            cdi.DeviceNode(path=vnpu.container_node, host_path=cdi.host_path(device_root, vnpu.host_node)),
        ),
    )


def vnpu_spec_env(vnpus: Sequence[HardVnpu]) -> dict[str, str]:
    """Spec-level environment of a claim with hard vNPUs."""
    if not vnpus:
        return {}
    return {
        "FLEXNPU_VNPU_IDS": ",".join(str(v.vnpu_id) for v in vnpus),
        "FLEXNPU_TEMPLATES": ",".join(v.template.name for v in vnpus),
    }


def vnpu_status_data(vnpu: HardVnpu) -> dict[str, Any]:
    """``status.devices[].data`` of a hard vNPU (the claim status names template, ID, resources)."""
    data: dict[str, Any] = {
        "mode": "hard",
        "die": vnpu.die.phy_id,
        "vdieID": vnpu.die.vdie_id,
        "model": vnpu.die.model,
        "template": vnpu.template.name,
        "vnpuID": vnpu.vnpu_id,
        "deviceNode": vnpu.host_node,
        "aicore": vnpu.template.aicore,
        "aicpu": vnpu.template.aicpu,
        "memoryBytes": vnpu.template.memory_bytes,
    }
    if vnpu.template.media is not None:
        data["media"] = vnpu.template.media
    return data


def _shared_edits(
    plan: ClaimPlan,
    endpoints: Endpoints | None,
    layout: NodeLayout,
    driver_mounts: Sequence[str],
    client_library: interposition.ClientLibrary | None,
) -> cdi.Edits:
    env = {"FLEXNPU_CLAIM_UID": plan.ref.uid}
    nodes: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()
    whole = [d for d in plan.devices if d.mode == DieMode.WHOLE]
    if whole:
        env["FLEXNPU_PHYSICAL_IDS"] = ",".join(str(d.die.phy_id) for d in whole)
    env.update(vnpu_spec_env(plan.vnpus))
    if whole or plan.vnpus:  # a device node of the driver's own: the shared nodes and driver files too
        nodes = tuple(node_files.SHARED_DEVICE_NODES)
        mounts = tuple(p for p in node_files.DRIVER_MOUNTS if p in driver_mounts)
    with_aclserver = endpoints is not None and bool(plan.shares)
    injected = cdi.Edits()
    if with_aclserver:
        env["FLEXNPU_CONF"] = CONTAINER_CONF
        env["FLEXNPU_VISIBLE_VNPUS"] = ",".join(str(sh.virtual_id) for sh in plan.shares)
        injected = interposition_plan(plan, layout, client_library).edits
        env.update({k: v for k, _, v in (e.partition("=") for e in injected.env)})
    edits = cdi.shared_edits(nodes, mounts, device_root=layout.device_root, env=env)
    if with_aclserver and endpoints is not None:
        conf_dir = layout.conf_dir(plan.ref.uid)
        edits = replace(
            edits,
            mounts=(
                *edits.mounts,
                cdi.Mount(str(conf_dir / "client.conf"), CONTAINER_CONF, ("ro", "nosuid", "nodev", "rbind")),
                cdi.Mount(endpoints.shm_dir, CONTAINER_SHM, ("rw", "nosuid", "nodev", "rbind")),
                *injected.mounts,
            ),
        )
    return edits


def interposition_plan(
    plan: ClaimPlan, layout: NodeLayout, client_library: interposition.ClientLibrary | None
) -> interposition.Plan:
    """How the claim's shares get libascendcl.so; InvalidInput (naming the field) if impossible."""
    lib = client_library or interposition.ClientLibrary(
        str(layout.client_library), str(layout.client_library.parent / interposition.PRELOAD_LIST_NAME), False
    )
    configs = [d.config for d in plan.devices if d.config is not None]
    return interposition.for_claim(configs, lib, claim_uid=plan.ref.uid)


def _client_conf(plan: ClaimPlan, endpoints: Endpoints, token: str) -> clientconf.ClientConf:
    transports = {d.config.transport for d in plan.devices if d.config is not None}
    unix = tcp = None
    if endpoints.unix_socket and Transport.TCP not in transports:
        unix = f"{CONTAINER_SHM}/{Path(endpoints.unix_socket).name}"
    if endpoints.tcp_port and Transport.UNIX not in transports:
        tcp = f"{endpoints.tcp_host}:{endpoints.tcp_port}"
    socs = [d.die.chip_model.soc_name(d.die.npu_name) for d in plan.devices if d.config is not None]
    return clientconf.ClientConf(
        soc_name=socs[0] if socs else "",
        claim_uid=plan.ref.uid,
        token=token,
        endpoints=clientconf.Endpoints(unix=unix, tcp=tcp),
        shm_dir=CONTAINER_SHM,
        shares=tuple(
            clientconf.ShareInfo(
                virtual_id=sh.virtual_id,
                memory_bytes=sh.memory_bytes,
                compute_percent=sh.compute_percent,
                policy=d.config.policy,
                memory_only=sh.memory_only,
            )
            for d in plan.devices
            if d.config is not None
            for sh in d.shares
        ),
    )


def _status(
    plan: ClaimPlan,
    prepared: Sequence[PreparedDevice],
    endpoints: Endpoints | None,
    layout: NodeLayout,
    now: str,
) -> tuple[JSON, ...]:
    docs: list[JSON] = []
    for d, pd in zip(plan.devices, prepared, strict=True):
        data: JSON = {"die": d.die.phy_id, "vdieID": d.die.vdie_id, "model": d.die.model, "mode": str(d.mode)}
        doc: JSON = {"driver": layout.driver_name, "pool": d.pool, "device": d.device}
        if d.share_id:
            doc["shareID"] = d.share_id
        if d.vnpu is not None:
            data.update(vnpu_status_data(d.vnpu))
        if d.shares:
            sh = d.shares[0]
            data.update(
                virtualID=sh.virtual_id,
                memoryBytes=sh.memory_bytes,
                computePercent=sh.compute_percent,
                policy=sh.policy,
                priority=sh.priority or "normal",
                memoryOnly=sh.memory_only,
            )
            if len(d.shares) > 1:  # equal distribution: every vNPU has the quota above
                data["virtualIDs"] = [s.virtual_id for s in d.shares]
            if endpoints is not None and endpoints.tcp_port:
                data["endpoint"] = f"{endpoints.tcp_host}:{endpoints.tcp_port}"
            if layout.control_link and layout.control_cidr:
                doc["networkData"] = {"interfaceName": layout.control_link, "ips": [layout.control_cidr]}
        data["cdiDeviceIDs"] = list(pd.cdi_device_ids)
        doc["data"] = data
        doc["conditions"] = [
            condition("Ready", "True", "Prepared", f"prepared on node {layout.pool_name}", now)
        ]
        docs.append(doc)
    return tuple(docs)


def failure_status(
    plan: ClaimPlan, *, driver_name: str, reason: str, message: str, now: str
) -> tuple[JSON, ...]:
    """``Ready=False`` with the error code as the reason, on each device this driver was to prepare."""
    docs: list[JSON] = []
    for d in plan.devices:
        doc: JSON = {"driver": driver_name, "pool": d.pool, "device": d.device}
        if d.share_id:
            doc["shareID"] = d.share_id
        doc["conditions"] = [condition("Ready", "False", reason, message, now)]
        docs.append(doc)
    return tuple(docs)


def ready_status(
    recorded: Sequence[Mapping[str, Any]],
    endpoints: Endpoints | None,
    *,
    ready: bool,
    reason: str,
    message: str,
    now: str,
) -> tuple[JSON, ...]:
    """The recorded device status with a new Ready condition; the recorded endpoint is the truth
    (a repeat prepare may have moved the aclserver)."""
    cond = condition("Ready", "True" if ready else "False", reason, message, now)
    out: list[JSON] = []
    for raw in recorded:
        doc = dict(raw)
        data = doc.get("data")
        if endpoints is not None and endpoints.tcp_port and isinstance(data, Mapping) and "endpoint" in data:
            doc["data"] = {**data, "endpoint": f"{endpoints.tcp_host}:{endpoints.tcp_port}"}
        doc["conditions"] = [cond]
        out.append(doc)
    return tuple(out)


def condition(ctype: str, status: str, reason: str, message: str, now: str) -> JSON:
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message[:CONDITION_MESSAGE_MAX],
        "lastTransitionTime": now,
    }
