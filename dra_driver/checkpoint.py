"""The node's record of what it prepared: per-claim files, versioned and checksummed, file-locked.

The checkpoint is the single source of truth for "what this node prepared". Every side
effect of a prepare is recorded here *before* it is made (state ``PrepareStarted`` with the
planned effects), and the completion afterwards (``PrepareCompleted``), so a crash at any
step leaves enough on disk to finish or roll back. The records are the frozen dataclasses of
``dra_driver/records.py``.

On-disk format, version 2 — the checkpoint path (``<state-dir>/checkpoint.json``) is a
*directory* with one small file per claim, so that a step writes one claim, never the node::

    checkpoint.json/<claim-uid>.json  {"version": 2, "checksum": "<sha256>", "entry": {...}}
    checkpoint.json/_boot.json        {"version": 2, "checksum": "<sha256>", "bootID": "..."}
    checkpoint.json/_untrusted.json   present while ownership is in doubt (see below)

The path is a directory on purpose: a version-1 driver (a rolling update's old pod) that
tries to read it fails with ``IsADirectoryError`` instead of reading "nothing prepared" and
sweeping every live claim. Version 1 was one file (``{"version": 1, "checksum", "data":
{"bootID", "claims": {uid: entry}}}``); :func:`decode` still reads it and the store migrates
it on first use (the old file is kept as ``checkpoint.json.v1``).

Every change goes through :meth:`CheckpointStore.update`: take the timed ``flock`` on
``checkpoint.lock`` (``dra_driver/files.py``), apply one closure to the in-memory index,
write that claim's file (atomic, fsynced), release. The index stays coherent across
processes (two plugin instances during a rolling update, ``flexnpu-smi``) through a
generation counter kept in the lock file: each writer bumps it under the lock, and a reader
that finds it changed reloads the directory; otherwise nothing is decoded.

Damaged state is never "nothing prepared": a record that cannot be read (corrupt, truncated,
wrong shape, newer version) stays where it is and makes the store *untrusted*
(:attr:`CheckpointStore.trusted`, :meth:`CheckpointStore.check_trusted` raising
:class:`CheckpointUntrusted`) until an operator adopts what the node holds or discards the
damaged records (``flexnpu-smi adopt`` / ``discard``). Destructive paths (the orphan sweep, the
reconciler's removals) consult it first. Content of a file never crash-loops the node.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dra_driver import files
from dra_driver.errors import ErrorCode, StateError, Unavailable
from dra_driver.records import (
    JSON,
    ClaimEntry,
    ClaimState,
    DieRecord,
    Effect,
    EffectKind,
    Mutation,
    Registration,
    StatusRecord,
    die_records,
    held_dies,
    prepared_per_die,
    set_state,
)

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "VERSION",
    "Checkpoint",
    "CheckpointStore",
    "CheckpointUntrusted",
    "ClaimBusy",
    "ClaimEntry",
    "ClaimLockHandle",
    "ClaimLocks",
    "ClaimState",
    "DieRecord",
    "Effect",
    "EffectKind",
    "Mutation",
    "Registration",
    "StatusRecord",
    "decode",
    "decode_record",
    "die_records",
    "encode",
    "encode_record",
    "held_dies",
    "prepared_per_die",
    "set_state",
]

VERSION = 2
V1 = 1
DEFAULT_LOCK_TIMEOUT = 10.0
BOOT_FILE = "_boot.json"
UNTRUSTED_FILE = "_untrusted.json"
RECORD_MAX_BYTES = 4 << 20
_RECORD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,62}\.json$")
log = logging.getLogger("flexnpu.checkpoint")


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


class CheckpointUntrusted(StateError):
    """The checkpoint holds records that cannot be read: nothing may be removed on its word."""

    default_code = ErrorCode.CHECKPOINT_UNTRUSTED


# -- codecs ------------------------------------------------------------------------------------


def _checksum(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()


def _bad(source: str, msg: str, fld: str | None = None) -> StateError:
    return StateError(f"{source}: {msg}"[:400], code=ErrorCode.CHECKPOINT_CORRUPT, field=fld)


def _envelope(raw: bytes, source: str, *, want: int) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _bad(source, f"not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise _bad(source, "top level is not an object")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise _bad(source, "missing or non-integer version", "version")
    if version > VERSION:
        raise _bad(source, f"written by a newer driver (version {version} > {VERSION})", "version")
    if version != want:
        raise _bad(source, f"version {version} where version {want} was expected", "version")
    return doc


def encode(cp: Checkpoint) -> bytes:
    """The version-1 single-file format (kept for tools and the migration tests)."""
    data = cp.to_data()
    doc = {"version": V1, "checksum": _checksum(data), "data": data}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def decode(raw: bytes, *, source: str = "checkpoint") -> Checkpoint:
    """Parse and verify a version-1 checkpoint; raise :class:`StateError` (CHECKPOINT_CORRUPT) if bad."""
    doc = _envelope(raw, source, want=V1)
    data = doc.get("data")
    if not isinstance(data, dict):
        raise _bad(source, "missing data object", "data")
    if doc.get("checksum") != _checksum(data):
        raise _bad(source, "checksum mismatch (file truncated or edited)", "checksum")
    raw_claims = data.get("claims") or {}
    if not isinstance(raw_claims, dict):
        raise _bad(source, "claims is not an object", "data.claims")
    try:
        claims = {str(uid): ClaimEntry.from_json(e) for uid, e in raw_claims.items()}
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise _bad(source, f"malformed claim entry ({exc!r})", "data.claims") from exc
    return Checkpoint(boot_id=str(data.get("bootID") or ""), claims=claims)


def encode_record(entry: ClaimEntry) -> bytes:
    body = entry.to_json()
    doc = {"version": VERSION, "checksum": _checksum(body), "entry": body}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def decode_record(raw: bytes, *, source: str) -> ClaimEntry:
    """One version-2 claim record; raise :class:`StateError` (CHECKPOINT_CORRUPT) if bad."""
    doc = _envelope(raw, source, want=VERSION)
    body = doc.get("entry")
    if not isinstance(body, dict):
        raise _bad(source, "missing entry object", "entry")
    if doc.get("checksum") != _checksum(body):
        raise _bad(source, "checksum mismatch (file truncated or edited)", "checksum")
    try:
        return ClaimEntry.from_json(body)
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise _bad(source, f"malformed claim entry ({exc!r})", "entry") from exc


def _encode_small(key: str, value: Any) -> bytes:
    doc = {"version": VERSION, "checksum": _checksum(value), key: value}
    return json.dumps(doc, sort_keys=True).encode() + b"\n"


def _decode_small(raw: bytes, key: str, *, source: str) -> Any:
    doc = _envelope(raw, source, want=VERSION)
    if key not in doc or doc.get("checksum") != _checksum(doc[key]):
        raise _bad(source, "checksum mismatch or missing value", key)
    return doc[key]


def current_boot_id() -> str:
    return files.boot_id()


# -- per-claim locks ---------------------------------------------------------------------------


class ClaimBusy(Unavailable):
    """Another thread or process is working on this claim (its claim lock is held)."""


@dataclass(slots=True)
class ClaimLockHandle:
    drop: bool = False  # set by the holder once the claim's entry is gone: the lock file goes too


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


# -- the store ---------------------------------------------------------------------------------


class CheckpointStore:
    """The per-claim checkpoint directory behind a timed cross-process lock, with an in-memory index.

    :meth:`update` is the one way to change a claim: one closure, one record written, under the
    lock. :meth:`entries` and :meth:`get` are consistent snapshots from the index (no decode
    unless another process wrote). :meth:`locked` holds every writer (in any process) off while
    the caller decides, for the orphan sweep.
    """

    def __init__(
        self, path: Path, *, boot_id: str | None = None, lock_timeout: float = DEFAULT_LOCK_TIMEOUT
    ) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name.removesuffix(".json") + ".lock")
        self.boot_id = current_boot_id() if boot_id is None else boot_id
        self.lock_timeout = lock_timeout
        self.claim_locks = ClaimLocks(path.parent / "locks")
        self.corrupt_copies: list[Path] = []  # damaged files set aside (kept for inspection)
        self._index: dict[str, ClaimEntry] = {}
        self._recorded_boot = ""
        self._bad: dict[str, str] = {}  # record file name -> why it cannot be read
        self._doubt = ""  # from _untrusted.json
        self._gen: int | None = None

    # -- locking and coherence -------------------------------------------------------------------

    @contextlib.contextmanager
    def _flock(self) -> Iterator[int]:
        """The checkpoint lock, with the index brought up to date; yields the lock fd."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with files.locked(self.lock_path, timeout=self.lock_timeout) as fd:
                if os.fstat(fd).st_size < 8:  # allocate the counter once, so bumping never needs space
                    os.pwrite(fd, bytes(8), 0)
                gen = _read_gen(fd)
                if gen != self._gen:
                    self._reload()
                    self._gen = gen
                yield fd
        except files.LockTimeout as exc:
            raise Unavailable(
                f"the checkpoint lock {self.lock_path} is held by another process for more than "
                f"{self.lock_timeout:g} s",
                code=ErrorCode.DEVICE_BUSY,
                field="checkpoint",
            ) from exc

    def _bump(self, fd: int) -> None:
        """Tell other processes that something changed (the caller holds the lock)."""
        gen = (self._gen or 0) + 1
        os.pwrite(fd, gen.to_bytes(8, "little"), 0)
        self._gen = gen

    def _reload(self) -> None:
        """Read every record (another process wrote, or first use); migrate version 1 first."""
        index: dict[str, ClaimEntry] = {}
        bad: dict[str, str] = {}
        boot, doubt = "", ""
        try:
            self._migrate_v1()
            names = sorted(os.listdir(self.path))
        except FileNotFoundError:
            names = []
        except OSError as exc:  # a symlink, a file where the directory belongs, EIO, ...
            names, doubt = [], f"cannot read the checkpoint at {self.path}: {exc}"[:1000]
        for name in names:
            if name.startswith("."):
                continue  # a temp file of an interrupted write
            p = self.path / name
            try:
                raw = files.read_nofollow(p, max_bytes=RECORD_MAX_BYTES)
                if name == BOOT_FILE:
                    boot = str(_decode_small(raw, "bootID", source=str(p)))
                elif name == UNTRUSTED_FILE:
                    doubt = str(_decode_small(raw, "reason", source=str(p)))[:1000] or "untrusted"
                elif _RECORD_RE.match(name):
                    entry = decode_record(raw, source=str(p))
                    if entry.uid != name.removesuffix(".json"):
                        raise _bad(str(p), f"records claim {entry.uid!r} under another name", "entry.uid")
                    index[entry.uid] = entry
                else:
                    raise _bad(str(p), "not a file this driver writes")
            except (StateError, OSError) as err:
                bad[name] = str(err)[:400]
        for name, why in bad.items():
            if name not in self._bad:
                log.error(
                    "checkpoint record %s cannot be read (%s): nothing is removed until it is adopted or discarded",
                    name,
                    why,
                )
        self._index, self._bad, self._recorded_boot, self._doubt = index, bad, boot, doubt

    def _migrate_v1(self) -> None:
        """Turn a version-1 file (or a migration a crash interrupted) into the version-2 directory."""
        v1_copy = self.path.with_name(self.path.name + ".v1")
        stale = list(self.path.parent.glob(f".{self.path.name}.migrating-*"))
        if os.path.lexists(self.path) and not self.path.is_dir():
            source = self.path
        elif not os.path.lexists(self.path) and stale and v1_copy.exists():
            source = v1_copy  # a crash between the two renames of an earlier migration
        else:
            return
        for old in stale:
            shutil.rmtree(old, ignore_errors=True)
        raw = files.read_nofollow(source, max_bytes=files.DEFAULT_MAX_READ)
        reason = ""
        try:
            cp = decode(raw, source=str(source))
        except StateError as err:
            copy = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time() * 1000)}")
            reason = f"{err}; the file is kept at {copy}"
            log.error("%s: keeping it aside and trusting nothing until it is adopted or discarded", err)
            cp = Checkpoint(boot_id=self.boot_id)
            v1_copy = copy
            self.corrupt_copies.append(copy)
        tmp = self.path.with_name(f".{self.path.name}.migrating-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(mode=0o700)
        for uid, entry in cp.claims.items():
            files.write_atomic(tmp / f"{uid}.json", encode_record(entry), sync=False)
        files.write_atomic(tmp / BOOT_FILE, _encode_small("bootID", cp.boot_id), sync=False)
        if reason:
            files.write_atomic(tmp / UNTRUSTED_FILE, _encode_small("reason", reason), sync=False)
        os.sync()  # every record of the migration is durable before the old file goes
        if source == self.path:
            os.replace(self.path, v1_copy)
        os.replace(tmp, self.path)
        files.fsync_dir(self.path.parent)
        if not reason:
            log.warning(
                "migrated the version-1 checkpoint (%d claims); the old file is kept at %s",
                len(cp.claims),
                v1_copy,
            )

    # -- the API ---------------------------------------------------------------------------------

    def update(self, uid: str, mutate: Mutation) -> ClaimEntry | None:
        """One recorded step for claim ``uid``: the entry ``mutate`` returns (None: dropped)."""
        with self._flock() as fd:
            if f"{uid}.json" in self._bad:
                raise CheckpointUntrusted(
                    f"the checkpoint record of this claim cannot be read ({self._bad[f'{uid}.json']}); "
                    "adopt or discard it first (flexnpu-smi adopt / discard)",
                    claim_uid=uid,
                    field="checkpoint",
                )
            old = self._index.get(uid)
            new = mutate(dict(self._index))
            if new == old:
                return new
            try:
                if new is None:
                    self._remove_record(uid)
                else:
                    if new.uid != uid:
                        raise ValueError(f"mutation for {uid} returned an entry for {new.uid}")
                    new = replace(new, updated_at=time.time())
                    self._write(f"{uid}.json", encode_record(new))
            except OSError as exc:  # files.WriteFailed: the previous record is intact
                raise StateError(
                    f"cannot record the step in {self.path}: {exc.strerror or exc}",
                    code=ErrorCode.WRITE_FAILED,
                    claim_uid=uid,
                    field="checkpoint",
                ) from exc
            finally:
                self._bump(fd)  # even a failed write may have changed the directory
            if new is None:
                self._index.pop(uid, None)
            else:
                self._index[uid] = new
            return new

    def entries(self) -> dict[str, ClaimEntry]:
        """Every entry, a consistent snapshot."""
        with self._flock():
            return dict(self._index)

    def get(self, uid: str) -> ClaimEntry | None:
        with self._flock():
            return self._index.get(uid)

    def read(self) -> Checkpoint:
        """A consistent snapshot (takes the lock briefly)."""
        with self._flock():
            return Checkpoint(boot_id=self._recorded_boot or self.boot_id, claims=dict(self._index))

    @property
    def trusted(self) -> bool:
        """Whether every record could be read (nothing damaged, nothing in doubt)."""
        with self._flock():
            return not self._bad and not self._doubt

    def doubts(self) -> list[str]:
        """Why the store is untrusted (empty when it is trusted)."""
        with self._flock():
            return ([self._doubt] if self._doubt else []) + [
                f"{n}: {why}" for n, why in sorted(self._bad.items())
            ]

    def check_trusted(self) -> None:
        """Raise :class:`CheckpointUntrusted` unless every record could be read."""
        why = self.doubts()
        if why:
            raise CheckpointUntrusted(
                "the checkpoint cannot be trusted, so nothing is removed until an operator runs "
                f"flexnpu-smi adopt or discard: {'; '.join(why)}"[:1500],
                field="checkpoint",
            )

    def damaged(self) -> dict[str, str]:
        """Record file name -> why it cannot be read."""
        with self._flock():
            return dict(self._bad)

    def trust(self, *, discard: bool, entries: Mapping[str, ClaimEntry] | None = None) -> list[Path]:
        """End the doubt: record ``entries`` (adopted from evidence), then set damaged records aside
        (``discard``) or keep them aside all the same; return where they were kept."""
        kept: list[Path] = []
        with self._flock() as fd:
            try:
                stamp = int(time.time() * 1000)
                for name in sorted(self._bad):  # first: an adopted entry may take a damaged one's name
                    copy = self.path.with_name(
                        f"{self.path.name}.{'discarded' if discard else 'adopted'}-{stamp}-{name}"
                    )
                    if os.path.lexists(self.path / name):
                        os.replace(self.path / name, copy)
                        kept.append(copy)
                for uid, entry in (entries or {}).items():
                    self._write(f"{uid}.json", encode_record(entry))
                    self._index[uid] = entry
                files.remove_nofollow(self.path / UNTRUSTED_FILE)
                if self.path.is_dir():
                    files.fsync_dir(self.path)
            finally:
                self._bump(fd)
                self._gen = None  # reload at next use
        return kept

    @contextlib.contextmanager
    def locked(self) -> Iterator[Checkpoint]:
        """The checkpoint with every writer held off; a change of ``boot_id`` is saved on exit."""
        with self._flock() as fd:
            cp = Checkpoint(boot_id=self._recorded_boot, claims=dict(self._index))
            yield cp
            if cp.boot_id != self._recorded_boot:
                self._write(BOOT_FILE, _encode_small("bootID", cp.boot_id))
                self._recorded_boot = cp.boot_id
                self._bump(fd)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Checkpoint]:
        """Read-modify-write of the whole checkpoint (tools and tests); writes only what changed."""
        with self._flock() as fd:
            cp = Checkpoint(boot_id=self._recorded_boot, claims=dict(self._index))
            yield cp
            changed = False
            for uid in set(self._index) - set(cp.claims):
                self._remove_record(uid)
                changed = True
            for uid, entry in cp.claims.items():
                if self._index.get(uid) != entry:
                    self._write(f"{uid}.json", encode_record(entry))
                    changed = True
            if cp.boot_id != self._recorded_boot:
                self._write(BOOT_FILE, _encode_small("bootID", cp.boot_id))
                changed = True
            if changed:
                self._index, self._recorded_boot = dict(cp.claims), cp.boot_id
                self._bump(fd)

    # -- writing (the caller holds the lock) -----------------------------------------------------

    def _write(self, name: str, payload: bytes) -> None:
        files.write_atomic(self.path / name, payload, dir_mode=0o700)

    def _remove_record(self, uid: str) -> None:
        if files.remove_nofollow(self.path / f"{uid}.json"):
            files.fsync_dir(self.path)


def _read_gen(fd: int) -> int:
    raw = os.pread(fd, 8, 0)
    return int.from_bytes(raw, "little") if len(raw) == 8 else 0
