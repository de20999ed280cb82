"""The side effects of a prepare: one do, one ensure (repeat prepare) and one undo per kind.

``kubeletplugin/prepare.py`` decides *what* and *when* (the effects a new prepare makes are planned
by ``dra_driver/render.py``'s :func:`~dra_driver.render.planned` and recorded in the checkpoint
before the first is made; ``kubeletplugin/execute.py`` sequences them); this module knows *how*. Each
:class:`~dra_driver.checkpoint.EffectKind` has its place in :func:`~dra_driver.render.planned` (which
also fixes the order effects are made in; undo runs it backwards), a failpoint in
:data:`PREPARE_POINT` and a branch in :meth:`Effects.do`, :meth:`Effects.ensure` and
:meth:`Effects.undo`; a new kind (a hard-split vNPU, say) is one enum member, its details type in
``dra_driver/records.py``, its place in :func:`~dra_driver.render.planned`, its failpoint and those
three branches. A path is checked to stay inside its directory where it is written. Every do and undo is idempotent, so a crash
anywhere converges by doing again or undoing again.

What is written comes from :func:`dra_driver.render.render`; nothing here builds a document.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import tenacity

from dra_driver import cdi, files, interposition, logs, netlink, paths, render, retrying, sharing
from dra_driver.checkpoint import ClaimEntry, Effect, EffectKind
from dra_driver.config import DEFAULT_CLIENT_LIBRARY, Config
from dra_driver.daemon_api.values import Endpoints, EntityInfo, RegisterRequest, RegisterResult
from dra_driver.discovery import node_files
from dra_driver.errors import ErrorCode, FlexNPUError, StateError, Unavailable, quote
from dra_driver.plan import ClaimPlan
from dra_driver.records import HardVnpuRecord
from dra_driver.sharing import Transport
from dra_kubeletplugin.claims import CALL_DEADLINE, ClaimRef
from flexnpu_wire import clientconf
from flexnpu_wire.shares import Share
from kubeletplugin.hardsplit import HardVnpus

JSON = dict[str, Any]

PREPARE_POINT: Mapping[EffectKind, str] = {
    EffectKind.HARD_VNPU: "prepare-after-hard-vnpu",
    EffectKind.DAEMON_REGISTRATION: "prepare-after-register",
    EffectKind.CLIENT_CONF: "prepare-after-client-conf",
    EffectKind.CDI_SPEC: "prepare-after-cdi",
}
"""The failpoint right after each effect a prepare makes (``dra_driver/failpoints.py``)."""


class Daemon(Protocol):
    def register(self, request: RegisterRequest) -> RegisterResult: ...

    def unregister(self, claim_uid: str) -> bool: ...

    def list(self) -> list[EntityInfo]: ...


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
    host_memory: sharing.HostMemoryBound = field(default_factory=sharing.HostMemoryBound)

    @classmethod
    def from_config(cls, cfg: Config, link: netlink.LinkSpec) -> PrepareSettings:
        """The node's settings: its flags, and the control link's address (``link``) when it has one."""
        return cls(
            driver_name=cfg.driver_name,
            pool_name=cfg.pool_name,
            cdi_dir=cfg.paths.cdi_dir,
            cdi_kind=cdi.Kind.parse(cfg.cdi_kind),
            device_root=cfg.paths.device_root,
            run_dir=cfg.paths.run_dir,
            control_link=cfg.control_link,
            control_address=link.address if cfg.control_link else "127.0.0.1",
            control_cidr=cfg.control_link_cidr if cfg.control_link else "",
            daemon_retry_seconds=cfg.daemon_retry_seconds,
            client_library=cfg.client_library,
            host_memory=cfg.host_memory,
        )

    @property
    def layout(self) -> render.NodeLayout:
        return render.NodeLayout(
            driver_name=self.driver_name,
            pool_name=self.pool_name,
            cdi_kind=self.cdi_kind,
            device_root=self.device_root,
            run_dir=self.run_dir,
            control_link=self.control_link,
            control_cidr=self.control_cidr,
            client_library=self.client_library,
            cdi_dir=self.cdi_dir,
        )


def client_library(layout: render.NodeLayout) -> interposition.ClientLibrary:
    """FlexNPU's libascendcl.so on this node, probed now (``--client-library``)."""
    return interposition.client_library(str(layout.client_library), is_file=os.path.isfile)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(slots=True)
class Job:
    """One prepare in progress: the plan, the claim's token, and what the daemon answered."""

    plan: ClaimPlan
    token: str
    layout: render.NodeLayout
    registration: RegisterResult | None = None
    _rendered: render.Rendered | None = None

    @property
    def endpoints(self) -> Endpoints | None:
        return self.registration.endpoints if self.registration is not None else None

    @property
    def rendered(self) -> render.Rendered:
        """Rendered once, after the daemon answered (or at once when the claim has no shares)."""
        if self._rendered is None:
            mounts = tuple(
                p
                for p in node_files.DRIVER_MOUNTS
                if Path(cdi.host_path(self.layout.device_root, p)).exists()
            )
            self._rendered = render.render(
                self.plan,
                self.endpoints,
                layout=self.layout,
                token=self.token,
                driver_mounts=mounts,
                client_library=client_library(self.layout),
                now=now(),
            )
        return self._rendered


class Effects:
    """Makes, repeats and undoes the effects of a claim."""

    def __init__(
        self,
        *,
        settings: PrepareSettings,
        daemon: Daemon | None,
        status: StatusWriter | None,
        hard: HardVnpus | None = None,
    ) -> None:
        self.settings = settings
        self.daemon = daemon
        self.status = status
        self.hard = hard  # hard-split vNPUs (kubeletplugin/hardsplit.py), None on a node without templates

    def lock_budget(self) -> float:
        """How long to wait for a claim's lock: long enough for its other call's daemon retries."""
        return self.retry_budget() + 15.0

    def retry_budget(self) -> float:
        """Seconds a daemon call may keep retrying: the configured budget, cut to the kubelet's deadline
        of the call this work is part of (the helper's ``CALL_DEADLINE``; none outside a kubelet call)."""
        deadline = CALL_DEADLINE.get()
        budget = self.settings.daemon_retry_seconds
        return budget if deadline is None else max(0.0, min(budget, deadline - time.monotonic()))

    # -- do ---------------------------------------------------------------------------------

    def do(self, eff: Effect, job: Job, clog: logs.ClaimLogger) -> None:
        with _oserror_names(eff, job.plan.ref.uid, "write"):
            self._do(eff, job, clog)

    def _do(self, eff: Effect, job: Job, clog: logs.ClaimLogger) -> None:
        if eff.kind == EffectKind.HARD_VNPU:
            self.hard_vnpus(job.plan.ref.uid).do(_vnpu_record(eff), job.plan.ref.uid, clog)
        elif eff.kind == EffectKind.DAEMON_REGISTRATION:
            job.registration = self.register(job, clog)
        elif eff.kind == EffectKind.CLIENT_CONF:
            self._write_client_conf(job)
        elif eff.kind == EffectKind.CDI_SPEC:
            _check_host_paths(job.rendered.spec, job.plan.ref.uid)
            cdi.write_spec(Path(eff.ref), job.rendered.spec, job.plan.ref.uid)
        elif eff.kind == EffectKind.CLAIM_STATUS:
            self.write_status(job.plan.ref, job.rendered.status, clog)
        else:  # pragma: no cover - the enum is closed
            raise _unknown(eff, job.plan.ref.uid)

    def ensure(self, entry: ClaimEntry, job: Job, clog: logs.ClaimLogger) -> None:
        """Repeat prepare (kubelet restart, node reboot): put back what a restart or a tmpfs lost.

        Registration is idempotent in the daemon (same endpoints while the aclserver runs; a new
        aclserver after a reboot), so it is repeated, and files are rewritten when missing or stale.
        """
        rec = entry.registration
        moved = False
        if rec is not None:
            job.registration = self.register(
                job, clog, tcp_port=rec.endpoints.tcp_port if rec.endpoints else 0
            )
            moved = rec.endpoints != job.registration.endpoints
        for eff in entry.effects:
            if eff.kind == EffectKind.HARD_VNPU:
                self.hard_vnpus(entry.uid).ensure(_vnpu_record(eff), entry.uid, clog)
            elif eff.kind == EffectKind.CLIENT_CONF and (
                moved or not (Path(eff.ref) / "client.conf").exists()
            ):
                clog.info("client.conf missing or aclserver endpoints changed; writing it again")
                self._write_client_conf(job)
            elif eff.kind == EffectKind.CDI_SPEC and (moved or not Path(eff.ref).exists()):
                clog.info("writing CDI spec %s again (reboot or restarted aclserver)", eff.ref)
                cdi.write_spec(Path(eff.ref), job.rendered.spec, job.plan.ref.uid)

    def register(self, job: Job, clog: logs.ClaimLogger, *, tcp_port: int = 0) -> RegisterResult:
        """Register the job's shares (``tcp_port``: the port to keep, when it is still free)."""
        ref = job.plan.ref
        # transport: unix: the aclserver listens on no TCP port (render.py leaves TCP out of client.conf)
        unix_only = any(
            d.config is not None and d.config.transport == Transport.UNIX for d in job.plan.devices
        )
        return self._register(ref, job.token, job.plan.shares, clog, tcp_port=tcp_port, unix_only=unix_only)

    def register_recorded(self, entry: ClaimEntry, clog: logs.ClaimLogger) -> RegisterResult:
        """Register a prepared claim again exactly as recorded: its token, its shares, its TCP port
        if still free (its unix socket is always the same), so its ``client.conf`` stays valid."""
        rec = entry.registration
        if rec is None:
            raise StateError(
                "the claim has no recorded daemon registration", claim_uid=entry.uid, field="effects"
            )
        ref = ClaimRef(entry.namespace, entry.uid, entry.name)
        port = rec.endpoints.tcp_port if rec.endpoints else 0
        # an aclserver that listened on TCP always had a port: none recorded means unix only
        unix_only = rec.endpoints is not None and not rec.endpoints.tcp_port
        return self._register(ref, rec.token, rec.shares, clog, tcp_port=port, unix_only=unix_only)

    def _register(
        self,
        ref: ClaimRef,
        token: str,
        shares: tuple[Share, ...],
        clog: logs.ClaimLogger,
        *,
        tcp_port: int,
        unix_only: bool,
    ) -> RegisterResult:
        if self.daemon is None:
            raise StateError(
                "soft-split shares need flexnpu-daemon, but no daemon socket is configured",
                code=ErrorCode.DAEMON_UNAVAILABLE,
                claim_uid=ref.uid,
                field="daemon-socket",
            )
        request = RegisterRequest(
            claim_uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            token=token,
            shares=shares,
            tcp_host=self.settings.control_address,
            tcp_port=tcp_port,
            unix_only=unix_only,
        )
        result: RegisterResult = self._retrying(clog)(self.daemon.register, request)
        return result

    def _write_client_conf(self, job: Job) -> None:
        conf = job.rendered.client_conf
        if conf is None:  # pragma: no cover - planned only with shares
            raise StateError("no client.conf to write", claim_uid=job.plan.ref.uid, field="client-conf")
        # The file is 0644: the container reads it through its bind mount as whatever UID the pod
        # runs as, which the node cannot know. The directories are 0700, so that no other host user
        # reaches the claim's token.
        conf_dir = paths.contained(job.rendered.conf_dir, claim_uid=job.plan.ref.uid)
        path = conf_dir / "client.conf"
        files.write_atomic(path, clientconf.render(conf).encode(), mode=0o644, dir_mode=0o700)
        for d in (path.parent, path.parent.parent):
            os.chmod(d, 0o700, follow_symlinks=False)

    def write_status(self, ref: ClaimRef, docs: Sequence[JSON], clog: logs.ClaimLogger) -> bool:
        """Best effort: the status is informative, never a reason to fail a claim."""
        if self.status is None:
            return False
        try:
            self.status.write(ref, docs)
        except Exception as err:
            clog.warning("could not write claim status: %s", err)
            return False
        return True

    def write_failure(self, plan: ClaimPlan, err: FlexNPUError, clog: logs.ClaimLogger) -> bool:
        """Best effort: ``Ready=False`` with the error code as the reason on each device of ``plan``."""
        docs = render.failure_status(
            plan, driver_name=self.settings.driver_name, reason=str(err.code), message=str(err), now=now()
        )
        return self.write_status(plan.ref, docs, clog)

    def set_ready(self, entry: ClaimEntry, *, ready: bool, reason: str, message: str) -> bool:
        """Write the recorded device status again with a new Ready condition."""
        if self.status is None or not entry.status_docs:
            return False
        rec = entry.registration
        docs = render.ready_status(
            entry.status_docs,
            rec.endpoints if rec else None,
            ready=ready,
            reason=reason,
            message=message,
            now=now(),
        )
        clog = logs.claim_logger(entry.uid, entry.namespace, entry.name)
        return self.write_status(ClaimRef(entry.namespace, entry.uid, entry.name), docs, clog)

    # -- undo -------------------------------------------------------------------------------

    def undo(self, entry: ClaimEntry, eff: Effect, clog: logs.ClaimLogger) -> None:
        """Undo one effect (idempotent). Raises, keeping the entry, if it cannot be undone now."""
        with _oserror_names(eff, entry.uid, "remove"):
            self._undo(entry, eff, clog)

    def _undo(self, entry: ClaimEntry, eff: Effect, clog: logs.ClaimLogger) -> None:
        if eff.kind == EffectKind.HARD_VNPU:
            self.hard_vnpus(entry.uid).undo(_vnpu_record(eff), entry.uid, clog)
        elif eff.kind == EffectKind.CDI_SPEC:
            path = Path(eff.ref)
            if _inside(path, self.settings.cdi_dir, entry.uid, clog) and cdi.remove_spec(path):
                clog.debug("removed CDI spec %s", eff.ref)
        elif eff.kind == EffectKind.CLIENT_CONF:
            path = Path(eff.ref)
            if _inside(path, self.settings.run_dir / "claims", entry.uid, clog):
                _remove_tree(path)
        elif eff.kind == EffectKind.DAEMON_REGISTRATION:
            if self.daemon is None:
                raise StateError(
                    "the claim has an aclserver but no daemon socket is configured",
                    code=ErrorCode.DAEMON_UNAVAILABLE,
                    claim_uid=entry.uid,
                    field="daemon-socket",
                )
            # Retried like Register: right after a daemon restart the node's gRPC channel can still
            # be in reconnect backoff and fail at once with UNAVAILABLE, which made the first
            # unprepare after a daemon crash fail (found by tests/integration/test_fault_runtime.py).
            self._retrying(clog)(self.daemon.unregister, entry.uid)
        elif eff.kind == EffectKind.CLAIM_STATUS:
            if self.status is not None:
                try:
                    self.status.write(ClaimRef(entry.namespace, entry.uid, entry.name), [])
                except Exception as err:
                    clog.info("could not clear claim status (claim gone?): %s", err)
        else:  # pragma: no cover - the enum is closed
            raise _unknown(eff, entry.uid)

    def hard_vnpus(self, uid: str) -> HardVnpus:
        """This node's vNPU effects; StateError (naming claim ``uid``) on a node without a vNPU manager."""
        if self.hard is None:
            raise StateError(
                "the claim has a hard-split vNPU but this node has no vNPU manager",
                code=ErrorCode.VNPU_FAILED,
                claim_uid=uid,
                field="effects.hard-vnpu",
            )
        return self.hard

    def forget_registration(self, uid: str, clog: logs.ClaimLogger) -> None:
        """Ask the daemon once to drop a registration it never confirmed (rollback)."""
        try:
            if self.daemon is not None:
                self.daemon.unregister(uid)
        except Unavailable as err:
            clog.warning(
                "daemon unreachable during rollback (%s); leaving any aclserver to the orphan sweep", err
            )

    def _retrying(self, clog: logs.ClaimLogger) -> tenacity.Retrying:
        return retrying.policy(
            stop=tenacity.stop_before_delay(self.retry_budget()),  # no attempt starts after it
            before_sleep=lambda rs: clog.warning(
                "daemon not reachable (attempt %d): %s; retrying",
                rs.attempt_number,
                rs.outcome and rs.outcome.exception(),
            ),
        )


def _check_host_paths(spec: cdi.Spec, uid: str) -> None:
    """A runtime would fail the container later (``CreateContainerError``): fail the claim now."""
    missing = [p for p in cdi.host_paths(spec) if not os.path.lexists(p)]
    if missing:
        raise StateError(
            f"the CDI spec names host paths that do not exist on this node: {quote(missing)}",
            code=ErrorCode.DEVICE_NOT_FOUND,
            claim_uid=uid,
            field="cdi-spec",
        )


def _inside(path: Path, root: Path, uid: str, clog: logs.ClaimLogger) -> bool:
    """Whether a recorded path lies in its configured directory; a path elsewhere is never removed."""
    if path.parent == root and uid in path.name:
        return True
    clog.error("recorded path %s is not inside %s; leaving it alone", str(path)[:200], root)
    return False


def _remove_tree(path: Path) -> None:
    """Remove a directory tree without following symlinks (a symlink itself is unlinked)."""
    if path.is_symlink():
        files.remove_nofollow(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _oserror_names(eff: Effect, uid: str, verb: str) -> Iterator[None]:
    """An OSError of a file effect becomes a StateError naming the claim and the effect."""
    try:
        yield
    except OSError as exc:
        raise StateError(
            f"cannot {verb} {eff.ref[:200]}: {exc.strerror or exc}",
            code=ErrorCode.WRITE_FAILED,
            claim_uid=uid,
            field=str(eff.kind),
        ) from exc


def _vnpu_record(eff: Effect) -> Mapping[str, Any]:
    return eff.details.vnpu if isinstance(eff.details, HardVnpuRecord) else {"vnpuID": eff.ref}


def _unknown(eff: Effect, uid: str) -> StateError:
    return StateError(
        f"unknown effect kind {eff.kind!r} in the checkpoint",
        code=ErrorCode.CHECKPOINT_CORRUPT,
        claim_uid=uid,
        field="effects",
    )
