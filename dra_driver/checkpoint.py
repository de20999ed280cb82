"""The node's record of what it prepared: typed records, versioned and checksummed on disk, file-locked.

The checkpoint is the single source of truth for "what this node prepared". Every side
effect of a prepare is recorded here *before* it is made (state ``PrepareStarted`` with the
planned effects), and the completion afterwards (``PrepareCompleted``), so a crash at any
step leaves enough on disk to finish or roll back.

Records are frozen dataclasses (:class:`ClaimEntry`, :class:`Effect`, :class:`DieRecord`,
:class:`Registration`); a change is a new record, written by :meth:`CheckpointStore.update`,
one short transaction per recorded step: take the timed file lock, read, apply one closure,
write, release. No network call happens under the lock.

On-disk format (version 1)::

    {"version": 1, "checksum": "<sha256 of the canonical JSON of data>",
     "data": {"bootID": "...", "claims": {"<uid>": {...ClaimEntry...}}}}

A missing file reads as empty. A corrupt, truncated, checksum-mismatched or future-version
file is *kept* as ``checkpoint.json.corrupt-<unix-ts>`` and the store starts empty; it never
crash-loops the node process. Concurrent processes (two plugin instances during a rolling
update, ``flexnpu-smi``) serialise through a timed ``flock`` on ``checkpoint.lock``
(``dra_driver/files.py``).

A new effect kind (for example a hard-split vNPU) is one :class:`EffectKind` member, an
optional details type registered in ``_DETAILS`` below, and its do/undo in
``kubeletplugin/effects.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from dra_driver import files
from dra_driver.claims import PreparedDevice
from dra_driver.daemon.model import Endpoints, Share
from dra_driver.devices import DieMode
from dra_driver.errors import ErrorCode, StateError, Unavailable
from dra_driver.plan import ClaimPlan, HeldDie

VERSION = 1
DEFAULT_LOCK_TIMEOUT = 10.0
log = logging.getLogger("flexnpu.checkpoint")

JSON = dict[str, Any]


class ClaimState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"
    UNPREPARE_STARTED = "UnprepareStarted"


class EffectKind(StrEnum):
    """Side effects of a prepare, in the order they are made (undone in reverse)."""

    DAEMON_REGISTRATION = "daemon-registration"  # ref: claim UID; details: Registration
    CLIENT_CONF = "client-conf"  # ref: the claim's client.conf directory
    CDI_SPEC = "cdi-spec"  # ref: the spec file
    CLAIM_STATUS = "claim-status"  # ref: claim UID; details: StatusRecord


@dataclass(frozen=True, slots=True)
class Registration:
    """What the daemon was asked for (token, shares) and, once it answered, where the aclserver is."""

    token: str
    shares: tuple[Share, ...]
    endpoints: Endpoints | None = None
    pid: int | None = None

    def to_json(self) -> JSON:
        doc: JSON = {"token": self.token, "shares": [s.to_dict() for s in self.shares]}
        if self.endpoints is not None:
            doc["endpoints"] = self.endpoints.to_dict()
        if self.pid is not None:
            doc["pid"] = self.pid
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Registration:
        ep = doc.get("endpoints")
        pid = doc.get("pid")
        return cls(
            token=str(doc["token"]),
            shares=tuple(Share.from_dict(s) for s in doc.get("shares") or ()),
            endpoints=Endpoints.from_dict(ep) if isinstance(ep, Mapping) else None,
            pid=int(pid) if pid is not None else None,
        )


@dataclass(frozen=True, slots=True)
class StatusRecord:
    """The device status documents last written to the claim (Kubernetes JSON, kept as written)."""

    devices: tuple[JSON, ...] = ()

    def to_json(self) -> JSON:
        return {"devices": list(self.devices)} if self.devices else {}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> StatusRecord:
        devices = doc.get("devices") or ()
        if not isinstance(devices, list) or not all(isinstance(d, dict) for d in devices):
            raise TypeError("claim-status devices must be a list of objects")
        return cls(devices=tuple(devices))


EffectDetails = Registration | StatusRecord
_DETAILS: dict[EffectKind, Callable[[Mapping[str, Any]], EffectDetails]] = {
    EffectKind.DAEMON_REGISTRATION: Registration.from_json,
    EffectKind.CLAIM_STATUS: StatusRecord.from_json,
}


@dataclass(frozen=True, slots=True)
class Effect:
    """One side effect made (or about to be made) for a claim; ``ref`` identifies it."""

    kind: EffectKind
    ref: str
    details: EffectDetails | None = None

    def to_json(self) -> JSON:
        return {
            "kind": str(self.kind),
            "ref": self.ref,
            "details": self.details.to_json() if self.details else {},
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Effect:
        kind = EffectKind(doc["kind"])
        raw = doc.get("details") or {}
        if not isinstance(raw, Mapping):
            raise TypeError(f"details of effect {kind} must be an object")
        decode = _DETAILS.get(kind)
        return cls(kind=kind, ref=str(doc["ref"]), details=decode(raw) if decode else None)


@dataclass(frozen=True, slots=True)
class DieRecord:
    """Which die a claim holds and how (the conflict check reads these)."""

    phy: int
    mode: DieMode
    device: str
    share_id: str | None = None
    policy: str | None = None  # soft shares only

    def to_json(self) -> JSON:
        doc: JSON = {"phy": self.phy, "mode": str(self.mode), "device": self.device, "shareID": self.share_id}
        if self.policy is not None:
            doc["policy"] = self.policy
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DieRecord:
        policy = doc.get("policy")
        share_id = doc.get("shareID")
        return cls(
            phy=int(doc["phy"]),
            mode=DieMode(doc["mode"]),
            device=str(doc.get("device") or ""),
            share_id=str(share_id) if share_id else None,
            policy=str(policy) if policy is not None else None,
        )


def device_to_json(d: PreparedDevice) -> JSON:
    doc: JSON = {
        "requestNames": list(d.request_names),
        "pool": d.pool,
        "device": d.device,
        "cdiDeviceIDs": list(d.cdi_device_ids),
    }
    if d.share_id is not None:
        doc["shareID"] = d.share_id
    return doc


def device_from_json(doc: Mapping[str, Any]) -> PreparedDevice:
    share_id = doc.get("shareID")
    return PreparedDevice(
        request_names=tuple(str(r) for r in doc.get("requestNames") or ()),
        pool=str(doc["pool"]),
        device=str(doc["device"]),
        cdi_device_ids=tuple(str(i) for i in doc.get("cdiDeviceIDs") or ()),
        share_id=str(share_id) if share_id is not None else None,
    )


@dataclass(frozen=True, slots=True)
class ClaimEntry:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[PreparedDevice, ...] = ()  # prepared devices (kubelet view)
    effects: tuple[Effect, ...] = ()
    dies: tuple[DieRecord, ...] = ()
    updated_at: float = 0.0

    def to_json(self) -> JSON:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "state": str(self.state),
            "devices": [device_to_json(d) for d in self.devices],
            "effects": [e.to_json() for e in self.effects],
            "dies": [d.to_json() for d in self.dies],
            "updatedAt": self.updated_at,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ClaimEntry:
        return cls(
            uid=str(doc["uid"]),
            namespace=str(doc["namespace"]),
            name=str(doc["name"]),
            state=ClaimState(doc["state"]),
            devices=tuple(device_from_json(d) for d in doc.get("devices") or ()),
            effects=tuple(Effect.from_json(e) for e in doc.get("effects") or ()),
            dies=tuple(DieRecord.from_json(d) for d in doc.get("dies") or ()),
            updated_at=float(doc.get("updatedAt") or 0.0),
        )

    def effect(self, kind: str) -> list[Effect]:
        return [e for e in self.effects if e.kind == kind]

    @property
    def registration(self) -> Registration | None:
        """The details of the daemon-registration effect, if the claim has shares."""
        for e in self.effects:
            if e.kind == EffectKind.DAEMON_REGISTRATION and isinstance(e.details, Registration):
                return e.details
        return None

    @property
    def status_docs(self) -> tuple[JSON, ...]:
        for e in self.effects:
            if e.kind == EffectKind.CLAIM_STATUS and isinstance(e.details, StatusRecord):
                return e.details.devices
        return ()

    def with_details(self, kind: EffectKind, details: EffectDetails) -> ClaimEntry:
        """A copy with the details of every effect of ``kind`` replaced."""
        return replace(
            self, effects=tuple(replace(e, details=details) if e.kind == kind else e for e in self.effects)
        )

    def with_effect(self, effect: Effect) -> ClaimEntry:
        """A copy with ``effect`` appended (unless one of the same kind and ref is recorded)."""
        if any(e.kind == effect.kind and e.ref == effect.ref for e in self.effects):
            return self
        return replace(self, effects=(*self.effects, effect))


def die_records(plan: ClaimPlan) -> tuple[DieRecord, ...]:
    """What the claim of ``plan`` will hold, as recorded with its intent."""
    return tuple(
        DieRecord(
            phy=d.die.phy_id,
            mode=d.mode,
            device=d.device,
            share_id=d.share_id,
            policy=d.share.policy if d.share is not None else None,
        )
        for d in plan.devices
    )


def held_dies(entries: Mapping[str, ClaimEntry], *, but: str) -> list[HeldDie]:
    """Every die the entries other than ``but`` hold, for :func:`dra_driver.plan.check_conflicts`."""
    return [
        HeldDie(phy=d.phy, mode=d.mode, policy=d.policy, namespace=e.namespace, name=e.name, uid=e.uid)
        for e in entries.values()
        if e.uid != but
        for d in e.dies
    ]


Mutation = Callable[[Mapping[str, ClaimEntry]], ClaimEntry | None]
"""Given every entry (read under the lock), the claim's new entry, or None to drop it."""


def prepared_per_die(entries: Iterable[ClaimEntry]) -> dict[tuple[int, str], int]:
    """(die, mode) -> how many prepared vNPUs / whole dies, over completed entries."""
    counts: dict[tuple[int, str], int] = {}
    for entry in entries:
        if entry.state == ClaimState.PREPARE_COMPLETED:
            for d in entry.dies:
                counts[(d.phy, str(d.mode))] = counts.get((d.phy, str(d.mode)), 0) + 1
    return counts


def set_state(uid: str, state: ClaimState) -> Mutation:
    """A mutation that moves claim ``uid`` to ``state`` (and leaves a missing entry missing)."""

    def mutate(entries: Mapping[str, ClaimEntry]) -> ClaimEntry | None:
        cur = entries.get(uid)
        return replace(cur, state=state) if cur is not None else None

    return mutate


@dataclass(slots=True)
class Checkpoint:
    """Everything on disk: the boot ID it was written in and one entry per claim."""

    boot_id: str = ""
    claims: dict[str, ClaimEntry] = field(default_factory=dict)

    def to_data(self) -> JSON:
        return {
            "bootID": self.boot_id,
            "claims": {uid: e.to_json() for uid, e in sorted(self.claims.items())},
        }


def _checksum(data: Mapping[str, Any]) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()


def encode(cp: Checkpoint) -> bytes:
    data = cp.to_data()
    doc = {"version": VERSION, "checksum": _checksum(data), "data": data}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def decode(raw: bytes, *, source: str = "checkpoint") -> Checkpoint:
    """Parse and verify a checkpoint; raise :class:`StateError` (CHECKPOINT_CORRUPT) if bad."""

    def bad(msg: str, fld: str | None = None) -> StateError:
        return StateError(f"{source}: {msg}", code=ErrorCode.CHECKPOINT_CORRUPT, field=fld)

    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise bad("top level is not an object")
    version = doc.get("version")
    if not isinstance(version, int):
        raise bad("missing or non-integer version", "version")
    if version > VERSION:
        raise bad(f"written by a newer driver (version {version} > {VERSION})", "version")
    data = migrate(version, doc.get("data"))
    if not isinstance(data, dict):
        raise bad("missing data object", "data")
    if doc.get("checksum") != _checksum(doc["data"]):
        raise bad("checksum mismatch (file truncated or edited)", "checksum")
    raw_claims = data.get("claims") or {}
    if not isinstance(raw_claims, dict):
        raise bad("claims is not an object", "data.claims")
    try:
        claims = {str(uid): ClaimEntry.from_json(e) for uid, e in raw_claims.items()}
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise bad(f"malformed claim entry ({exc!r})"[:300], "data.claims") from exc
    return Checkpoint(boot_id=str(data.get("bootID") or ""), claims=claims)


def migrate(version: int, data: Any) -> Any:
    """Bring older on-disk data to the current shape (version 1 is the first format)."""
    if version < 1:
        raise StateError(
            f"unknown checkpoint version {version}", code=ErrorCode.CHECKPOINT_CORRUPT, field="version"
        )
    return data


def current_boot_id() -> str:
    return files.boot_id()


class ClaimBusy(Unavailable):
    """Another thread or process is working on this claim (its claim lock is held)."""


class ClaimLocks:
    """One lock per claim, held for a whole prepare or unprepare of that claim (network retries
    included), so that the checkpoint lock itself is only ever held for one short step.

    In-process, a ``threading.Lock`` per UID; across processes (two plugin instances in a
    rolling update, ``flexnpu-smi``), an ``flock`` on ``<dir>/<uid>.lock``. The file is unlinked
    by the holder when the claim's entry is gone (``drop=True``); a waiter that then gets the
    lock on the unlinked file sees that its inode is no longer the path's and tries again.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._mutex = threading.Lock()
        self._local: dict[str, threading.Lock] = {}
        self._held: set[str] = set()

    def busy(self, uid: str) -> bool:
        """Whether this process is working on ``uid`` right now."""
        with self._mutex:
            return uid in self._held

    @contextlib.contextmanager
    def hold(self, uid: str, *, timeout: float) -> Iterator[ClaimLockHandle]:
        """Hold claim ``uid`` (raises :class:`ClaimBusy` after ``timeout`` seconds)."""
        with self._mutex:
            local = self._local.setdefault(uid, threading.Lock())
        deadline = time.monotonic() + timeout
        acquired = local.acquire(timeout=timeout) if timeout > 0 else local.acquire(blocking=False)
        if not acquired:
            raise _busy(uid, timeout)
        handle = ClaimLockHandle()
        try:
            with self._mutex:
                self._held.add(uid)
            path = self.directory / f"{uid}.lock"
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            while True:
                try:
                    with files.locked(path, timeout=max(deadline - time.monotonic(), 0.0)) as fd:
                        if not _same_file(fd, path):
                            continue  # the previous holder unlinked it: lock the new one
                        yield handle
                        if handle.drop:
                            files.remove_nofollow(path)
                        return
                except files.LockTimeout as exc:
                    raise _busy(uid, timeout) from exc
        finally:
            with self._mutex:
                self._held.discard(uid)
                if handle.drop:
                    self._local.pop(uid, None)
            local.release()


@dataclass(slots=True)
class ClaimLockHandle:
    drop: bool = False  # set by the holder once the claim's entry is gone: the lock file goes too


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return os.fstat(fd).st_ino == st.st_ino


def _busy(uid: str, timeout: float) -> ClaimBusy:
    return ClaimBusy(
        f"another prepare or unprepare of this claim is still running (waited {timeout:g} s)",
        code=ErrorCode.DEVICE_BUSY,
        claim_uid=uid,
        field="claim",
    )


class CheckpointStore:
    """The checkpoint file behind a timed cross-process lock.

    :meth:`update` is the one way to change a claim: one read, one closure, one write under the
    lock. :meth:`entries` and :meth:`get` are consistent snapshots. :meth:`locked` holds every
    writer (in any process) off while the caller decides, for the orphan sweep.
    """

    def __init__(
        self, path: Path, *, boot_id: str | None = None, lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    ) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name.removesuffix(".json") + ".lock")
        self.boot_id = current_boot_id() if boot_id is None else boot_id
        self.lock_timeout = lock_timeout
        self.corrupt_copies: list[Path] = []
        self.claim_locks = ClaimLocks(path.parent / "locks")

    @contextlib.contextmanager
    def _flock(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with files.locked(self.lock_path, timeout=self.lock_timeout):
                yield
        except files.LockTimeout as exc:
            raise Unavailable(
                f"the checkpoint lock {self.lock_path} is held by another process for more than "
                f"{self.lock_timeout:g} s",
                code=ErrorCode.DEVICE_BUSY,
                field="checkpoint",
            ) from exc

    def _load(self) -> Checkpoint:
        """Read the checkpoint (the caller holds the lock)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return Checkpoint(boot_id=self.boot_id)
        try:
            return decode(raw, source=str(self.path))
        except StateError as err:
            copy = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time() * 1000)}")
            os.replace(self.path, copy)
            self.corrupt_copies.append(copy)
            log.error("%s; kept a copy at %s and starting with an empty checkpoint", err, copy)
            return Checkpoint(boot_id=self.boot_id)

    def save(self, cp: Checkpoint) -> None:
        """Write the whole checkpoint (the caller holds the lock)."""
        files.write_atomic(self.path, encode(cp))

    # -- the API -------------------------------------------------------------------------------

    def update(self, uid: str, mutate: Mutation) -> ClaimEntry | None:
        """One recorded step for claim ``uid``: the entry ``mutate`` returns (None: dropped)."""
        with self._flock():
            cp = self._load()
            new = mutate(dict(cp.claims))
            old = cp.claims.get(uid)
            if new is None:
                if old is None:
                    return None
                del cp.claims[uid]
            else:
                if new.uid != uid:
                    raise ValueError(f"mutation for {uid} returned an entry for {new.uid}")
                if new == old:
                    return new
                new = replace(new, updated_at=time.time())
                cp.claims[uid] = new
            try:
                self.save(cp)
            except OSError as exc:  # files.WriteFailed: the previous checkpoint is intact
                raise StateError(
                    f"cannot record the step in {self.path}: {exc.strerror or exc}",
                    code=ErrorCode.WRITE_FAILED,
                    claim_uid=uid,
                    field="checkpoint",
                ) from exc
            return new

    def entries(self) -> dict[str, ClaimEntry]:
        """Every entry, a consistent snapshot."""
        return self.read().claims

    def get(self, uid: str) -> ClaimEntry | None:
        return self.entries().get(uid)

    def read(self) -> Checkpoint:
        """A consistent snapshot (takes the lock briefly)."""
        with self._flock():
            return self._load()

    @contextlib.contextmanager
    def locked(self) -> Iterator[Checkpoint]:
        """The checkpoint with every writer held off; a change of ``boot_id`` is saved on exit."""
        with self._flock():
            cp = self._load()
            before = cp.boot_id
            yield cp
            if cp.boot_id != before:
                current = self._load()
                current.boot_id = cp.boot_id
                self.save(current)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Checkpoint]:
        """Read-modify-write of the whole checkpoint (tools and tests); saves only on change."""
        with self._flock():
            cp = self._load()
            before = encode(cp) if self.path.exists() else b""
            yield cp
            if encode(cp) != before:
                self.save(cp)
