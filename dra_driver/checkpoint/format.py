"""The checkpoint's bytes: the versioned, checksummed envelope and its codecs (pure).

This module owns what a checkpoint file holds (the format is described in
:mod:`dra_driver.checkpoint`): the version-2 per-claim record and the small files beside it
(``_boot.json``, ``_untrusted.json``), the version-1 single file a rolling update's old pod may
have left, the checksum both use, and the CHECKPOINT_CORRUPT error a bad file gets. It touches
no file.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from dra_driver.errors import ErrorCode, StateError
from dra_driver.records import JSON, ClaimEntry

VERSION = 2
V1 = 1
BOOT_FILE = "_boot.json"
UNTRUSTED_FILE = "_untrusted.json"
RECORD_MAX_BYTES = 4 << 20
RECORD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,62}\.json$")


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


def checksum(data: Any) -> str:
    """SHA-256 of the canonical JSON of ``data`` (sorted keys, no spaces)."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()


def corrupt(source: str, msg: str, fld: str | None = None) -> StateError:
    """The CHECKPOINT_CORRUPT error for file ``source``."""
    return StateError(f"{source}: {msg}"[:400], code=ErrorCode.CHECKPOINT_CORRUPT, field=fld)


def envelope(raw: bytes, source: str, *, want: int) -> dict[str, Any]:
    """The parsed top level of a checkpoint file of version ``want``."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise corrupt(source, f"not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise corrupt(source, "top level is not an object")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise corrupt(source, "missing or non-integer version", "version")
    if version > VERSION:
        raise corrupt(source, f"written by a newer driver (version {version} > {VERSION})", "version")
    if version != want:
        raise corrupt(source, f"version {version} where version {want} was expected", "version")
    return doc


def encode(cp: Checkpoint) -> bytes:
    """The version-1 single-file format (kept for tools and the migration tests)."""
    data = cp.to_data()
    doc = {"version": V1, "checksum": checksum(data), "data": data}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def decode(raw: bytes, *, source: str = "checkpoint") -> Checkpoint:
    """Parse and verify a version-1 checkpoint; raise :class:`StateError` (CHECKPOINT_CORRUPT) if bad."""
    data = _checked_body(envelope(raw, source, want=V1), "data", source)
    raw_claims = data.get("claims") or {}
    if not isinstance(raw_claims, dict):
        raise corrupt(source, "claims is not an object", "data.claims")
    claims = {str(uid): _claim_entry(e, source, "data.claims") for uid, e in raw_claims.items()}
    return Checkpoint(boot_id=str(data.get("bootID") or ""), claims=claims)


def encode_record(entry: ClaimEntry) -> bytes:
    """One version-2 claim record, checksummed."""
    body = entry.to_json()
    doc = {"version": VERSION, "checksum": checksum(body), "entry": body}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def decode_record(raw: bytes, *, source: str) -> ClaimEntry:
    """One version-2 claim record; raise :class:`StateError` (CHECKPOINT_CORRUPT) if bad."""
    body = _checked_body(envelope(raw, source, want=VERSION), "entry", source)
    return _claim_entry(body, source, "entry")


def _checked_body(doc: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    """The object under ``key`` of an envelope, its checksum verified."""
    body = doc.get(key)
    if not isinstance(body, dict):
        raise corrupt(source, f"missing {key} object", key)
    if doc.get("checksum") != checksum(body):
        raise corrupt(source, "checksum mismatch (file truncated or edited)", "checksum")
    return body


def _claim_entry(body: Any, source: str, fld: str) -> ClaimEntry:
    try:
        return ClaimEntry.from_json(body)
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise corrupt(source, f"malformed claim entry ({exc!r})", fld) from exc


def encode_small(key: str, value: Any) -> bytes:
    """A version-2 file holding one checksummed value (``_boot.json``, ``_untrusted.json``)."""
    doc = {"version": VERSION, "checksum": checksum(value), key: value}
    return json.dumps(doc, sort_keys=True).encode() + b"\n"


def decode_small(raw: bytes, key: str, *, source: str) -> Any:
    """The value of a file :func:`encode_small` wrote; raise :class:`StateError` if bad."""
    doc = envelope(raw, source, want=VERSION)
    if key not in doc or doc.get("checksum") != checksum(doc[key]):
        raise corrupt(source, "checksum mismatch or missing value", key)
    return doc[key]
