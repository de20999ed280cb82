"""The node's record of what it prepared: versioned, checksummed, atomic, file-locked.

The checkpoint is the single source of truth for "what this node prepared". Every side
effect of a prepare is recorded here *before* it is made (state ``PrepareStarted`` with the
planned effects), and the completion afterwards (``PrepareCompleted``), so a crash at any
step leaves enough on disk to finish or roll back.

On-disk format (version 1)::

    {"version": 1, "checksum": "<sha256 of the canonical JSON of data>",
     "data": {"bootID": "...", "claims": {"<uid>": {...ClaimEntry...}}}}

A missing file reads as empty. A corrupt, truncated, checksum-mismatched or future-version
file is *kept* as ``checkpoint.json.corrupt-<unix-ts>`` and the store starts empty; it never
crash-loops the node process. Concurrent processes (two plugin instances during a rolling
update, ``flexnpu-smi``) serialise through an ``fcntl`` lock on ``checkpoint.lock``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from dra_driver.errors import ErrorCode, StateError

VERSION = 1
log = logging.getLogger("flexnpu.checkpoint")


class ClaimState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"
    UNPREPARE_STARTED = "UnprepareStarted"


@dataclass(slots=True)
class Effect:
    """One side effect made (or about to be made) for a claim.

    ``kind`` is one of ``cdi-spec``, ``daemon-registration``, ``shm-dir``, ``client-conf``,
    ``link-address``, ``claim-status``; ``ref`` identifies it (a path, a claim UID, an address).
    """

    kind: str
    ref: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "ref": self.ref, "details": self.details}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Effect:
        return cls(kind=str(doc["kind"]), ref=str(doc["ref"]), details=dict(doc.get("details") or {}))


@dataclass(slots=True)
class ClaimEntry:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: list[dict[str, Any]] = field(default_factory=list)  # prepared devices (kubelet view)
    effects: list[Effect] = field(default_factory=list)
    dies: list[dict[str, Any]] = field(default_factory=list)  # {"phy": int, "mode": str, "shareID": str|None}
    updated_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "state": str(self.state),
            "devices": self.devices,
            "effects": [e.to_json() for e in self.effects],
            "dies": self.dies,
            "updatedAt": self.updated_at,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ClaimEntry:
        return cls(
            uid=str(doc["uid"]),
            namespace=str(doc["namespace"]),
            name=str(doc["name"]),
            state=ClaimState(doc["state"]),
            devices=list(doc.get("devices") or []),
            effects=[Effect.from_json(e) for e in doc.get("effects") or []],
            dies=list(doc.get("dies") or []),
            updated_at=float(doc.get("updatedAt") or 0.0),
        )

    def effect(self, kind: str) -> list[Effect]:
        return [e for e in self.effects if e.kind == kind]

    def add_effect(self, effect: Effect) -> None:
        if not any(e.kind == effect.kind and e.ref == effect.ref for e in self.effects):
            self.effects.append(effect)


@dataclass(slots=True)
class Checkpoint:
    boot_id: str = ""
    claims: dict[str, ClaimEntry] = field(default_factory=dict)

    def to_data(self) -> dict[str, Any]:
        return {
            "bootID": self.boot_id,
            "claims": {uid: e.to_json() for uid, e in sorted(self.claims.items())},
        }


def _checksum(data: dict[str, Any]) -> str:
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
    try:
        claims = {uid: ClaimEntry.from_json(e) for uid, e in (data.get("claims") or {}).items()}
    except (KeyError, ValueError, TypeError) as exc:
        raise bad(f"malformed claim entry ({exc})", "data.claims") from exc
    return Checkpoint(boot_id=str(data.get("bootID") or ""), claims=claims)


def migrate(version: int, data: Any) -> Any:
    """Bring older on-disk data to the current shape (version 1 is the first format)."""
    if version < 1:
        raise StateError(
            f"unknown checkpoint version {version}", code=ErrorCode.CHECKPOINT_CORRUPT, field="version"
        )
    return data


def write_atomic(path: Path, payload: bytes, *, mode: int = 0o600) -> None:
    """Write ``payload`` to ``path`` via a synced temp file and rename, then sync the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def current_boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


class CheckpointStore:
    """Load/save the checkpoint under an exclusive file lock.

    Use :meth:`transaction` for read-modify-write; it saves only if the content changed.
    """

    def __init__(self, path: Path, *, boot_id: str | None = None) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name.removesuffix(".json") + ".lock")
        self.boot_id = current_boot_id() if boot_id is None else boot_id
        self.corrupt_copies: list[Path] = []

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def load(self) -> Checkpoint:
        """Read the checkpoint (caller holds the lock for read-modify-write)."""
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
        write_atomic(self.path, encode(cp))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Checkpoint]:
        with self.locked():
            cp = self.load()
            before = encode(cp) if self.path.exists() else b""
            yield cp
            after = encode(cp)
            if after != before:
                self.save(cp)

    def read(self) -> Checkpoint:
        """A consistent snapshot (takes the lock briefly)."""
        with self.locked():
            return self.load()

    def put(self, cp: Checkpoint, entry: ClaimEntry) -> None:
        """Update an entry inside a transaction and persist immediately (a recorded step)."""
        entry.updated_at = time.time()
        cp.claims[entry.uid] = entry
        self.save(cp)
