"""The daemon's registry on disk: what aclservers it started, for re-adoption after a restart.

One JSON file (``registry.json`` under ``--state-dir``), versioned and checksummed, replaced
atomically (temp file in the same directory, fsync, rename, fsync of the directory), mode 0600
because it holds the claims' tokens. A missing file reads as empty; a corrupt one raises
:class:`StateError` with code ``CheckpointCorrupt`` and can be set aside with :func:`quarantine`.

The file is written compact: each entry is its canonical JSON (sorted keys, no spaces), the
same text the checksum covers, so :class:`Writer` encodes an entity once and a save with N
claims costs a join of N cached strings instead of N encodings (``bench/bench_scale.py``).
Earlier daemons read it unchanged (version 1; whitespace never mattered to them).
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
from dra_driver.errors import ErrorCode, StateError
from flexnpu_runtime.daemon.model import Entity

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


class Writer:
    """Saves the registry at ``path``, encoding each entity only when it changed. Not thread-safe:
    the daemon saves under its registry lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._encoded: dict[str, tuple[Entity, str]] = {}

    def save(self, entities: Iterable[Entity], *, sync: bool = True) -> None:
        texts: list[str] = []
        fresh: dict[str, tuple[Entity, str]] = {}
        for e in sorted(entities, key=lambda e: e.claim_uid):
            cached = self._encoded.get(e.claim_uid)
            if cached is None or cached[0] is not e:
                cached = (e, _canonical(e.to_dict()))
            fresh[e.claim_uid] = cached
            texts.append(cached[1])
        self._encoded = fresh
        listing = "[" + ",".join(texts) + "]"
        checksum = "sha256:" + hashlib.sha256(listing.encode()).hexdigest()
        data = f'{{"checksum":{json.dumps(checksum)},"entries":{listing},"version":{VERSION}}}'
        files.write_atomic(self.path, data.encode(), mode=0o600, sync=sync, dir_mode=0o700)


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


def _canonical(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def _checksum(entries: list[Any]) -> str:
    return "sha256:" + hashlib.sha256(_canonical(entries).encode()).hexdigest()
