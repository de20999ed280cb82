"""The daemon's registry on disk: what aclservers it started, for re-adoption after a restart.

One JSON file (``registry.json`` under ``--state-dir``), versioned and checksummed, replaced
atomically (temp file in the same directory, fsync, rename, fsync of the directory), mode 0600
because it holds the claims' tokens. A missing file reads as empty; a corrupt one raises
:class:`StateError` with code ``CheckpointCorrupt`` and can be set aside with :func:`quarantine`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dra_driver import files
from dra_driver.daemon.model import Entity
from dra_driver.errors import ErrorCode, StateError

VERSION = 1
FILE_NAME = "registry.json"


def load(path: Path) -> list[Entity]:
    """Every entity recorded in ``path`` (empty when the file does not exist)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            raise ValueError("top level is not an object")
        if doc.get("version") != VERSION:
            raise ValueError(f"unsupported version {doc.get('version')!r} (this daemon reads {VERSION})")
        entries = doc["entries"]
        if not isinstance(entries, list):
            raise ValueError("entries is not a list")
        if doc.get("checksum") != _checksum(entries):
            raise ValueError("checksum mismatch")
        return [Entity.from_dict(e) for e in entries]
    except (ValueError, KeyError, TypeError) as exc:
        raise StateError(
            f"registry {path} is corrupt: {exc}", code=ErrorCode.CHECKPOINT_CORRUPT, field=str(path)
        ) from exc


def save(path: Path, entities: Iterable[Entity], *, sync: bool = True) -> None:
    """Replace ``path`` atomically with ``entities`` (sorted by claim UID).

    ``sync=False`` defers durability to a later ``files.fsync_file(path)`` (see ``files.write_atomic``).
    """
    entries = [e.to_dict() for e in sorted(entities, key=lambda e: e.claim_uid)]
    doc = {"version": VERSION, "checksum": _checksum(entries), "entries": entries}
    data = json.dumps(doc, indent=1, sort_keys=True).encode()
    files.write_atomic(path, data, mode=0o600, sync=sync, dir_mode=0o700)


def quarantine(path: Path) -> Path:
    """Move a corrupt registry aside as ``<name>.corrupt-<timestamp>`` and return the new path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        target = path.with_name(f"{path.name}.corrupt-{stamp}.{n}")
        n += 1
    os.replace(path, target)
    return target


def _checksum(entries: list[Any]) -> str:
    canonical = json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()
