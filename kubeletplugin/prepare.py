"""Prepare and unprepare claims: the only place that sequences side effects.

Order, always: GET the claim (outside the lock) → plan (pure) → under the checkpoint lock:
record the intent (``PrepareStarted`` with every planned effect) → register shares with the
daemon (which starts the aclserver) → write ``client.conf`` → write the CDI spec → record
``PrepareCompleted`` → write the claim's device status (best effort, outside the lock).
Unprepare records ``UnprepareStarted``, undoes the recorded effects in reverse order and
drops the entry. A crash anywhere leaves a checkpoint entry from which the next prepare or
unprepare of the claim (or the reconciler) converges, because each effect is idempotent.
A prepare that fails part-way rolls back what it made, so nothing half-prepared remains.

Each claim gets its own result; one bad claim never fails the batch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import tenacity

from dra_driver import cdi, clientconf, failpoints, interposition, logs, paths, sharing
from dra_driver.aclserver.codes import Policy
from dra_driver.checkpoint import Checkpoint, CheckpointStore, ClaimEntry, ClaimState, Effect, write_atomic
from dra_driver.claims import ClaimRef, ClaimResult, PreparedDevice
from dra_driver.config import DEFAULT_CLIENT_LIBRARY
from dra_driver.daemon.model import RegisterRequest, RegisterResult, Share
from dra_driver.devices import DieMode, Inventory
from dra_driver.discovery import node_files
from dra_driver.errors import ErrorCode, FlexNPUError, StateError, Unavailable
from dra_driver.plan import ClaimPlan, plan_claim
from dra_driver.telemetry import Telemetry

log = logging.getLogger("flexnpu.prepare")

ClaimGetter = Callable[[str, str], Mapping[str, Any]]

CONTAINER_CONF = "/etc/flexnpu/client.conf"
CONTAINER_SHM = "/dev/shm/flexnpu"

# Effect kinds, in the order they are made (undone in reverse).
DAEMON = "daemon-registration"
CLIENT_CONF = "client-conf"
CDI_SPEC = "cdi-spec"
CLAIM_STATUS = "claim-status"


class Daemon(Protocol):
    def register(self, request: RegisterRequest) -> RegisterResult: ...

    def unregister(self, claim_uid: str) -> bool: ...


class StatusWriter(Protocol):
    def write(self, ref: ClaimRef, devices: Sequence[Mapping[str, Any]]) -> None: ...


@dataclass(frozen=True, slots=True)
class PrepareSettings:
    driver_name: str
    pool_name: str
    cdi_dir: Path
    cdi_kind: cdi.Kind
    device_root: Path
    run_dir: Path = Path("/var/run/flexnpu")
    control_link: str = ""
    control_address: str = "127.0.0.1"
    control_cidr: str = ""
    daemon_retry_seconds: float = 30.0
    client_library: Path = Path(DEFAULT_CLIENT_LIBRARY)


class Preparer:
    """Implements :class:`dra_driver.claims.ClaimPreparer` on top of the checkpoint."""

    def __init__(
        self,
        *,
        settings: PrepareSettings,
        store: CheckpointStore,
        get_claim: ClaimGetter,
        inventory: Callable[[], Inventory],
        daemon: Daemon | None = None,
        status: StatusWriter | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.get_claim = get_claim
        self.inventory = inventory
        self.daemon = daemon
        self.status = status
        self.telemetry = telemetry or Telemetry(
            node_name=settings.pool_name, driver_name=settings.driver_name, enabled=False
        )
        self._lock = threading.Lock()

    # -- kubelet calls ---------------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        results: dict[str, ClaimResult] = {}
        for ref in claims:
            clog = logs.claim_logger(ref.uid, ref.namespace, ref.name)
            with self.telemetry.operation(
                "prepare", claim_uid=ref.uid or "-", namespace=ref.namespace, name=ref.name
            ) as rec:
                try:
                    results[ref.uid] = self._prepare_one(ref, clog)
                    clog.info("prepared %d device(s)", len(results[ref.uid].devices))
                except FlexNPUError as err:
                    err.for_claim(ref.uid)
                    clog.warning("prepare failed: %s", err)
                    rec.fail(err.code)
                    results[ref.uid] = ClaimResult(error=str(err))
                except Exception as exc:  # a bug must not fail the other claims of the batch
                    clog.exception("prepare failed with an internal error")
                    rec.fail(ErrorCode.INTERNAL)
                    results[ref.uid] = ClaimResult(error=f"claim {ref.uid}: internal error: {exc!r}")
        self._report_prepared()
        return results

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        out: dict[str, str] = {}
        for ref in claims:
            clog = logs.claim_logger(ref.uid, ref.namespace, ref.name)
            with self.telemetry.operation(
                "unprepare", claim_uid=ref.uid or "-", namespace=ref.namespace, name=ref.name
            ) as rec:
                try:
                    paths.check_uid(ref.uid)
                    removed = self.unprepare_uid(ref.uid, clog)
                    clog.info(
                        "unprepared" if removed else "unprepare: claim not prepared here (nothing to do)"
                    )
                    out[ref.uid] = ""
                except FlexNPUError as err:
                    err.for_claim(ref.uid)
                    clog.warning("unprepare failed: %s", err)
                    rec.fail(err.code)
                    out[ref.uid] = str(err)
                except Exception as exc:
                    clog.exception("unprepare failed with an internal error")
                    rec.fail(ErrorCode.INTERNAL)
                    out[ref.uid] = f"claim {ref.uid}: internal error: {exc!r}"
        self._report_prepared()
        return out

    def _report_prepared(self) -> None:
        """Prepared vNPUs / whole dies per die, for the ``flexnpu_dra_prepared_vnpus`` gauge."""
        counts: dict[tuple[int, str], int] = {}
        for entry in self.store.read().claims.values():
            if entry.state != ClaimState.PREPARE_COMPLETED:
                continue
            for d in entry.dies:
                key = (int(d["phy"]), str(d["mode"]))
                counts[key] = counts.get(key, 0) + 1
        self.telemetry.set_prepared_vnpus(counts)

    # -- prepare ---------------------------------------------------------------------------

    def _prepare_one(self, ref: ClaimRef, clog: logs.ClaimLogger) -> ClaimResult:
        paths.check_uid(ref.uid)
        paths.check_namespace(ref.namespace, claim_uid=ref.uid)
        paths.check_name(ref.name, claim_uid=ref.uid)
        claim = self.get_claim(ref.namespace, ref.name)  # outside the lock, like the Go helper
        plan = plan_claim(
            claim,
            ref=ref,
            driver_name=self.settings.driver_name,
            pool_name=self.settings.pool_name,
            inventory=self.inventory(),
        )
        if not plan.devices:
            return ClaimResult(devices=())  # only other drivers' results: nothing to do here
        try:
            shares = self._plan_shares(plan)  # validates quotas and opaque config before any effect
            with self._lock, self.store.transaction() as cp:
                entry = cp.claims.get(ref.uid)
                if entry is not None and entry.state == ClaimState.PREPARE_COMPLETED:
                    self._ensure_effects(plan, entry, clog)
                    devices = tuple(_device_from_json(d) for d in entry.devices)
                else:
                    if entry is not None:
                        clog.info("finishing an interrupted %s before preparing again", entry.state)
                        self._undo_effects(entry, clog)
                        del cp.claims[ref.uid]
                    self._check_conflicts(plan, shares, cp.claims.values())
                    devices = self._prepare_new(plan, shares, cp, clog)
        except FlexNPUError as err:
            self._write_failure_status(plan, err.for_claim(ref.uid), clog)
            raise
        self._write_status(plan, devices, shares, clog)
        return ClaimResult(devices=devices)

    def _write_failure_status(self, plan: ClaimPlan, err: FlexNPUError, clog: logs.ClaimLogger) -> None:
        """``Ready=False`` with the error code as the reason, on each device this driver was to prepare."""
        if self.status is None:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        docs: list[dict[str, Any]] = []
        for d in plan.devices:
            doc: dict[str, Any] = {"driver": self.settings.driver_name, "pool": d.pool, "device": d.device}
            if d.share_id:
                doc["shareID"] = d.share_id
            doc["conditions"] = [_condition("Ready", "False", str(err.code), str(err), now)]
            docs.append(doc)
        try:
            self.status.write(plan.ref, docs)
        except FlexNPUError as status_err:
            clog.info("could not write the failure to the claim status: %s", status_err)

    def _plan_shares(self, plan: ClaimPlan) -> list[Share]:
        """Quotas from the allocation (the source of truth) and policy from opaque config."""
        uid = plan.ref.uid
        out: list[Share] = []
        for vid, d in enumerate(x for x in plan.devices if x.mode == DieMode.SOFT):
            fld = f"status.allocation.devices.results[{d.request}/{d.device}].consumedCapacity"
            quota = sharing.share_quota(
                d.consumed_capacity, die_memory_bytes=d.die.memory_bytes, claim_uid=uid, field=fld
            )
            cfg = sharing.resolve(
                ((f"status.allocation.devices.config[{c.index}].opaque.parameters", c.parameters)
                 for c in plan.configs_for(d.request)),
                claim_uid=uid,
            )  # fmt: skip
            out.append(
                Share(
                    virtual_id=vid,
                    die_phy_id=d.die.phy_id,
                    memory_bytes=quota.memory_bytes,
                    compute_percent=quota.compute_percent,
                    policy=str(cfg.policy),
                    memory_only=cfg.memory_only,
                )
            )
        return out

    def _check_conflicts(self, plan: ClaimPlan, shares: list[Share], entries: Iterable[ClaimEntry]) -> None:
        """The node is the last line of defence: one die is whole XOR shared, one policy per die."""
        policies = {s.die_phy_id: s.policy for s in shares}
        for d in plan.devices:
            for other in entries:
                for od in other.dies:
                    if od.get("phy") != d.die.phy_id:
                        continue
                    other_mode = od.get("mode")
                    if d.mode == DieMode.WHOLE or other_mode == str(DieMode.WHOLE):
                        raise StateError(
                            f"die {d.die.phy_id} ({d.device}) is already prepared "
                            f"{'exclusively' if other_mode == 'whole' else 'as shares'} for claim "
                            f"{other.namespace}/{other.name} ({other.uid})",
                            code=ErrorCode.DEVICE_BUSY,
                            claim_uid=plan.ref.uid,
                            field="status.allocation.devices.results",
                        )
                    mine, theirs = policies.get(d.die.phy_id), od.get("policy")
                    if mine and theirs and mine != theirs:
                        raise StateError(
                            f"die {d.die.phy_id} runs shares with policy {theirs!r} (claim "
                            f"{other.namespace}/{other.name}); this claim asks for {mine!r}",
                            code=ErrorCode.POLICY_CONFLICT,
                            claim_uid=plan.ref.uid,
                            field="config.opaque.parameters.policy",
                        )
        for a in shares:
            for b in shares:
                if a.die_phy_id == b.die_phy_id and a.policy != b.policy:
                    raise StateError(
                        f"two shares of die {a.die_phy_id} in this claim ask for policies {a.policy!r} and {b.policy!r}",
                        code=ErrorCode.POLICY_CONFLICT,
                        claim_uid=plan.ref.uid,
                        field="config.opaque.parameters.policy",
                    )

    def _prepare_new(
        self, plan: ClaimPlan, shares: list[Share], cp: Any, clog: logs.ClaimLogger
    ) -> tuple[PreparedDevice, ...]:
        s = self.settings
        uid = plan.ref.uid
        spec_file = cdi.spec_path(s.cdi_dir, s.cdi_kind, uid)
        conf_dir = paths.inside(s.run_dir / "claims", uid, claim_uid=uid)
        token = secrets.token_hex(32)
        effects = []
        if shares:
            effects += [
                Effect(DAEMON, uid, {"token": token, "shares": [sh.to_dict() for sh in shares]}),
                Effect(CLIENT_CONF, str(conf_dir)),
            ]
        effects.append(Effect(CDI_SPEC, str(spec_file)))
        entry = ClaimEntry(
            uid=uid,
            namespace=plan.ref.namespace,
            name=plan.ref.name,
            state=ClaimState.PREPARE_STARTED,
            dies=_dies(plan, shares),
            effects=effects,
        )
        self.store.put(cp, entry)  # the intent is on disk before any effect
        failpoints.hit("prepare-after-intent")
        registration: RegisterResult | None = None
        try:
            registration = self._register(plan, shares, token, clog) if shares else None
            if registration is not None:
                failpoints.hit("prepare-after-register")
                self._write_client_conf(plan, shares, token, registration, conf_dir)
                failpoints.hit("prepare-after-client-conf")
            spec, devices = self.build_spec(plan, shares, registration, conf_dir)
            cdi.write_spec(s.cdi_dir, spec, uid)
            failpoints.hit("prepare-after-cdi")
        except FlexNPUError:
            clog.warning("prepare failed part-way; rolling back")
            try:
                if shares and registration is None:
                    # The daemon never confirmed the registration. Ask once to undo it; if the daemon
                    # is unreachable, the orphan sweep removes whatever it may have started, since no
                    # checkpoint entry owns it.
                    self._forget_registration(entry, clog)
                self._undo_effects(entry, clog)
                del cp.claims[uid]
                self.store.save(cp)
            except FlexNPUError as undo_err:  # keep the entry: the reconciler finishes the job
                clog.error("rollback incomplete, left for the reconciler: %s", undo_err)
            raise
        if registration is not None:
            for eff in entry.effect(DAEMON):
                eff.details["endpoints"] = registration.endpoints.to_dict()
                eff.details["pid"] = registration.pid
        entry.devices = [_device_to_json(d) for d in devices]
        entry.state = ClaimState.PREPARE_COMPLETED
        entry.add_effect(Effect(CLAIM_STATUS, uid))
        self.store.put(cp, entry)
        failpoints.hit("prepare-after-complete")
        return tuple(devices)

    def _forget_registration(self, entry: ClaimEntry, clog: logs.ClaimLogger) -> None:
        try:
            if self.daemon is not None:
                self.daemon.unregister(entry.uid)
        except Unavailable as err:
            clog.warning(
                "daemon unreachable during rollback (%s); leaving any aclserver to the orphan sweep", err
            )
        entry.effects = [e for e in entry.effects if e.kind != DAEMON]

    def _register(
        self, plan: ClaimPlan, shares: list[Share], token: str, clog: logs.ClaimLogger
    ) -> RegisterResult:
        if self.daemon is None:
            raise StateError(
                "soft-split shares need flexnpu-daemon, but no daemon socket is configured",
                code=ErrorCode.DAEMON_UNAVAILABLE,
                claim_uid=plan.ref.uid,
                field="daemon-socket",
            )
        daemon = self.daemon
        request = RegisterRequest(
            claim_uid=plan.ref.uid,
            namespace=plan.ref.namespace,
            name=plan.ref.name,
            token=token,
            shares=tuple(shares),
            tcp_host=self.settings.control_address,
        )

        def attempt() -> RegisterResult:
            return daemon.register(request)

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(Unavailable),
            stop=tenacity.stop_after_delay(self.settings.daemon_retry_seconds),
            wait=tenacity.wait_exponential_jitter(initial=0.1, max=2.0),
            before_sleep=lambda rs: clog.warning(
                "daemon not reachable (attempt %d): %s; retrying",
                rs.attempt_number,
                rs.outcome and rs.outcome.exception(),
            ),
            reraise=True,
        )
        return retrying(attempt)

    def _write_client_conf(
        self, plan: ClaimPlan, shares: list[Share], token: str, reg: RegisterResult, conf_dir: Path
    ) -> None:
        cfgs = [
            sharing.resolve(
                ((str(c.index), c.parameters) for c in plan.configs_for(d.request)), claim_uid=plan.ref.uid
            )
            for d in plan.devices
            if d.mode == DieMode.SOFT
        ]
        transports = {c.transport for c in cfgs}
        unix = tcp = None
        if reg.endpoints.unix_socket and sharing.Transport.TCP not in transports:
            unix = f"{CONTAINER_SHM}/{Path(reg.endpoints.unix_socket).name}"
        if reg.endpoints.tcp_port and sharing.Transport.UNIX not in transports:
            tcp = f"{reg.endpoints.tcp_host}:{reg.endpoints.tcp_port}"
        conf = clientconf.ClientConf(
            claim_uid=plan.ref.uid,
            token=token,
            endpoints=clientconf.Endpoints(unix=unix, tcp=tcp),
            shm_dir=CONTAINER_SHM,
            shares=tuple(
                clientconf.ShareInfo(
                    virtual_id=sh.virtual_id,
                    memory_bytes=sh.memory_bytes,
                    compute_percent=sh.compute_percent,
                    policy=Policy(sh.policy),
                    memory_only=sh.memory_only,
                )
                for sh in shares
            ),
        )
        conf_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        write_atomic(conf_dir / "client.conf", clientconf.render(conf).encode(), mode=0o644)

    def build_spec(
        self,
        plan: ClaimPlan,
        shares: list[Share],
        registration: RegisterResult | None,
        conf_dir: Path,
    ) -> tuple[cdi.Spec, list[PreparedDevice]]:
        """The claim's CDI spec and kubelet devices (deterministic from the plan and the endpoints)."""
        s = self.settings
        uid = plan.ref.uid
        cdi_devices: list[cdi.CDIDevice] = []
        prepared: list[PreparedDevice] = []
        soft = iter(shares)
        for d in plan.devices:
            name = cdi.device_name(uid, d.device if not d.share_id else f"{d.device}-{d.share_id}")
            if d.mode == DieMode.WHOLE:
                edits = cdi.whole_die_edits([d.die.device_node], device_root=s.device_root)
            else:
                sh = next(soft)
                edits = cdi.Edits(env=(f"FLEXNPU_VNPU_{sh.virtual_id}={d.device}",))
            cdi_devices.append(cdi.CDIDevice(name=name, edits=edits))
            prepared.append(
                PreparedDevice(
                    request_names=(d.request_name,),
                    pool=d.pool,
                    device=d.device,
                    cdi_device_ids=(cdi.qualified_id(s.cdi_kind, name),),
                    share_id=d.share_id,
                )
            )
        env = {"FLEXNPU_CLAIM_UID": uid}
        nodes: list[str] = []
        mounts: list[cdi.Mount] = []
        if any(d.mode == DieMode.WHOLE for d in plan.devices):
            env["FLEXNPU_PHYSICAL_IDS"] = ",".join(
                str(d.die.phy_id) for d in plan.devices if d.mode == DieMode.WHOLE
            )
            nodes = list(node_files.SHARED_DEVICE_NODES)
            mounts = [
                cdi.Mount(host_path=cdi.host_path(s.device_root, p), container_path=p)
                for p in node_files.DRIVER_MOUNTS
                if Path(cdi.host_path(s.device_root, p)).exists()
            ]
        if registration is not None:
            env["FLEXNPU_CONF"] = CONTAINER_CONF
            env["FLEXNPU_VISIBLE_VNPUS"] = ",".join(str(sh.virtual_id) for sh in shares)
            mounts.append(
                cdi.Mount(str(conf_dir / "client.conf"), CONTAINER_CONF, ("ro", "nosuid", "nodev", "rbind"))
            )
            mounts.append(
                cdi.Mount(registration.endpoints.shm_dir, CONTAINER_SHM, ("rw", "nosuid", "nodev", "rbind"))
            )
            lib = interposition.client_library(str(s.client_library), is_file=os.path.isfile)
            cfgs = [
                sharing.resolve(
                    ((str(c.index), c.parameters) for c in plan.configs_for(d.request)), claim_uid=uid
                )
                for d in plan.devices
                if d.mode == DieMode.SOFT
            ]
            injected = interposition.for_claim(cfgs, lib, claim_uid=uid).edits
            env.update({k: v for k, _, v in (e.partition("=") for e in injected.env)})
            mounts.extend(injected.mounts)
        shared = cdi.Edits(
            env=tuple(f"{k}={v}" for k, v in sorted(env.items())),
            device_nodes=tuple(cdi.DeviceNode(p, cdi.host_path(s.device_root, p)) for p in nodes),
            mounts=tuple(mounts),
        )
        return cdi.Spec(kind=s.cdi_kind, devices=tuple(cdi_devices), edits=shared), prepared

    def _ensure_effects(self, plan: ClaimPlan, entry: ClaimEntry, clog: logs.ClaimLogger) -> None:
        """Repeat prepare (kubelet restart, node reboot): put back what a restart or a tmpfs lost.

        Registration is idempotent in the daemon (same endpoints while the aclserver runs; a new
        aclserver after a reboot), so it is repeated, and files are rewritten when missing or stale.
        """
        shares = [Share.from_dict(x) for e in entry.effect(DAEMON) for x in e.details.get("shares", [])]
        conf_effects = entry.effect(CLIENT_CONF)
        conf_dir = Path(conf_effects[0].ref) if conf_effects else self.settings.run_dir / "claims" / entry.uid
        reg: RegisterResult | None = None
        rewrite = False
        if shares:
            eff = entry.effect(DAEMON)[0]
            token = str(eff.details["token"])
            reg = self._register(plan, shares, token, clog)
            if (
                not (conf_dir / "client.conf").exists()
                or eff.details.get("endpoints") != reg.endpoints.to_dict()
            ):
                clog.info("client.conf missing or aclserver endpoints changed; writing it again")
                self._write_client_conf(plan, shares, token, reg, conf_dir)
                eff.details["endpoints"] = reg.endpoints.to_dict()
                rewrite = True
        for eff in entry.effect(CDI_SPEC):
            if rewrite or not Path(eff.ref).exists():
                clog.info("writing CDI spec %s again (reboot or restarted aclserver)", eff.ref)
                spec, _ = self.build_spec(plan, shares, reg, conf_dir)
                cdi.write_spec(self.settings.cdi_dir, spec, plan.ref.uid)

    # -- claim status ------------------------------------------------------------------------

    def _write_status(
        self, plan: ClaimPlan, devices: Sequence[PreparedDevice], shares: list[Share], clog: logs.ClaimLogger
    ) -> None:
        if self.status is None:
            return
        s = self.settings
        entry = self.store.read().claims.get(plan.ref.uid)
        endpoints: dict[str, Any] = {}
        for eff in entry.effect(DAEMON) if entry else []:
            endpoints = dict(eff.details.get("endpoints") or {})
        by_vid = iter(shares)
        docs: list[dict[str, Any]] = []
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for d, pd in zip(plan.devices, devices, strict=True):
            data: dict[str, Any] = {
                "die": d.die.phy_id,
                "vdieID": d.die.vdie_id,
                "model": d.die.model,
                "mode": str(d.mode),
            }
            doc: dict[str, Any] = {"driver": s.driver_name, "pool": d.pool, "device": d.device}
            if d.share_id:
                doc["shareID"] = d.share_id
            if d.mode == DieMode.SOFT:
                sh = next(by_vid)
                data.update(
                    virtualID=sh.virtual_id,
                    memoryBytes=sh.memory_bytes,
                    computePercent=sh.compute_percent,
                    policy=sh.policy,
                    memoryOnly=sh.memory_only,
                )
                if endpoints.get("tcp_port"):
                    data["endpoint"] = f"{endpoints['tcp_host']}:{endpoints['tcp_port']}"
                if s.control_link and s.control_cidr:
                    doc["networkData"] = {"interfaceName": s.control_link, "ips": [s.control_cidr]}
            data["cdiDeviceIDs"] = list(pd.cdi_device_ids)
            doc["data"] = data
            doc["conditions"] = [
                _condition("Ready", "True", "Prepared", f"prepared on node {s.pool_name}", now)
            ]
            docs.append(doc)
        try:
            self.status.write(plan.ref, docs)
        except FlexNPUError as err:  # status is informative: never fail a prepared claim for it
            clog.warning("could not write claim status: %s", err)
        with self.locked() as cp:
            current = cp.claims.get(plan.ref.uid)
            for eff in current.effect(CLAIM_STATUS) if current else []:
                eff.details["devices"] = docs
            if current is None:
                # An unprepare ran between our prepare and this write and cleared the status
                # before we wrote it: clear it again so no unprepared claim shows devices.
                try:
                    self.status.write(plan.ref, [])
                except FlexNPUError as err:
                    clog.info("could not clear claim status after a concurrent unprepare: %s", err)

    def set_ready(self, uid: str, ready: bool, reason: str, message: str) -> bool:
        """Rewrite the claim's device status with a new Ready condition (aclserver down or back).

        Returns whether a status was written. Uses the device status recorded at prepare.
        """
        entry = self.store.read().claims.get(uid)
        if self.status is None or entry is None or entry.state != ClaimState.PREPARE_COMPLETED:
            return False
        docs = [dict(d) for e in entry.effect(CLAIM_STATUS) for d in e.details.get("devices") or []]
        if not docs:
            return False
        endpoints = next((e.details.get("endpoints") or {} for e in entry.effect(DAEMON)), {})
        for d in docs:  # the recorded endpoint is the truth (a re-prepare may have moved the aclserver)
            if endpoints.get("tcp_port") and isinstance(d.get("data"), dict) and "endpoint" in d["data"]:
                d["data"] = {**d["data"], "endpoint": f"{endpoints['tcp_host']}:{endpoints['tcp_port']}"}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cond = _condition("Ready", "True" if ready else "False", reason, message, now)
        for d in docs:
            d["conditions"] = [cond]
        try:
            self.status.write(ClaimRef(entry.namespace, entry.uid, entry.name), docs)
        except FlexNPUError as err:
            logs.claim_logger(uid, entry.namespace, entry.name).warning(
                "could not update claim status: %s", err
            )
            return False
        return True

    # -- for the reconciler and operator tools ------------------------------------------------

    @contextlib.contextmanager
    def locked(self) -> Iterator[Checkpoint]:
        """The checkpoint, with every prepare and unprepare (in any process) held off."""
        with self._lock, self.store.transaction() as cp:
            yield cp

    def settle_interrupted(self) -> list[str]:
        """Roll back entries a crash left in PrepareStarted/UnprepareStarted; their UIDs.

        Under the lock no prepare is in flight (in this or another process), so such an entry is
        certainly interrupted. An effect that cannot be undone now (daemon down) keeps the entry
        for the next pass.
        """
        done: list[str] = []
        with self.locked() as cp:
            for uid, entry in list(cp.claims.items()):
                if entry.state == ClaimState.PREPARE_COMPLETED:
                    continue
                clog = logs.claim_logger(uid, entry.namespace, entry.name)
                try:
                    self._undo_effects(entry, clog)
                except FlexNPUError as err:
                    clog.warning("cannot roll back yet: %s", err)
                    continue
                del cp.claims[uid]
                self.store.save(cp)
                done.append(uid)
        return done

    # -- unprepare -------------------------------------------------------------------------

    def unprepare_uid(self, uid: str, clog: logs.ClaimLogger) -> bool:
        with self._lock, self.store.transaction() as cp:
            entry = cp.claims.get(uid)
            if entry is None:
                return False
            entry.state = ClaimState.UNPREPARE_STARTED
            self.store.put(cp, entry)
            failpoints.hit("unprepare-after-intent")
            self._undo_effects(entry, clog)
            del cp.claims[uid]
            self.store.save(cp)
            return True

    def _undo_effects(self, entry: ClaimEntry, clog: logs.ClaimLogger) -> None:
        """Undo every recorded effect, newest first. Raises (keeping the entry) if one cannot be undone."""
        for eff in reversed(entry.effects):
            self._undo_one(entry, eff, clog)
            failpoints.hit(f"unprepare-after-{eff.kind}")

    def _undo_one(self, entry: ClaimEntry, eff: Effect, clog: logs.ClaimLogger) -> None:
        if eff.kind == CDI_SPEC:
            if cdi.remove_spec(Path(eff.ref)):
                clog.debug("removed CDI spec %s", eff.ref)
        elif eff.kind == CLIENT_CONF:
            shutil.rmtree(eff.ref, ignore_errors=True)
        elif eff.kind == DAEMON:
            if self.daemon is None:
                raise StateError(
                    "the claim has an aclserver but no daemon socket is configured",
                    code=ErrorCode.DAEMON_UNAVAILABLE,
                    claim_uid=entry.uid,
                    field="daemon-socket",
                )
            daemon = self.daemon
            # Retried like Register: right after a daemon restart the node's gRPC channel can still
            # be in reconnect backoff and fail at once with UNAVAILABLE, which made the first
            # unprepare after a daemon crash fail (found by tests/integration/test_fault_runtime.py).
            retrying = tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(Unavailable),
                stop=tenacity.stop_after_delay(self.settings.daemon_retry_seconds),
                wait=tenacity.wait_exponential_jitter(initial=0.1, max=2.0),
                reraise=True,
            )
            retrying(daemon.unregister, entry.uid)
        elif eff.kind == CLAIM_STATUS:
            if self.status is not None:
                try:
                    self.status.write(ClaimRef(entry.namespace, entry.uid, entry.name), [])
                except FlexNPUError as err:  # unprepare must not depend on the API
                    clog.info("could not clear claim status (claim gone?): %s", err)
        else:
            raise StateError(
                f"unknown effect kind {eff.kind!r} in the checkpoint",
                code=ErrorCode.CHECKPOINT_CORRUPT,
                claim_uid=entry.uid,
                field="effects",
            )


def _dies(plan: ClaimPlan, shares: list[Share]) -> list[dict[str, Any]]:
    policies = {s.die_phy_id: s.policy for s in shares}
    out = []
    for d in plan.devices:
        doc: dict[str, Any] = {
            "phy": d.die.phy_id,
            "mode": str(d.mode),
            "device": d.device,
            "shareID": d.share_id,
        }
        if d.mode == DieMode.SOFT:
            doc["policy"] = policies[d.die.phy_id]
        out.append(doc)
    return out


def _condition(ctype: str, status: str, reason: str, message: str, now: str) -> dict[str, Any]:
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": now,
    }


def _device_to_json(d: PreparedDevice) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "requestNames": list(d.request_names),
        "pool": d.pool,
        "device": d.device,
        "cdiDeviceIDs": list(d.cdi_device_ids),
    }
    if d.share_id is not None:
        doc["shareID"] = d.share_id
    return doc


def _device_from_json(doc: Mapping[str, Any]) -> PreparedDevice:
    return PreparedDevice(
        request_names=tuple(doc.get("requestNames") or ()),
        pool=str(doc["pool"]),
        device=str(doc["device"]),
        cdi_device_ids=tuple(doc.get("cdiDeviceIDs") or ()),
        share_id=doc.get("shareID"),
    )
