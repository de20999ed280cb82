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
(:attr:`CheckpointStore.trusted`, :meth:`CheckpointStore.doubts` saying why; an update of a
claim whose record is damaged refused with :class:`CheckpointUntrusted`) until an operator adopts what the node holds or discards the
damaged records (``flexnpu-smi adopt`` / ``discard``). Destructive paths (the orphan sweep, the
reconciler's removals) consult it first. Content of a file never crash-loops the node.

The package: ``format.py`` (the envelope, checksum and codecs, pure), ``migration.py`` (version 1
to version 2), ``locks.py`` (per-claim locks), ``store.py`` (:class:`CheckpointStore`). Every
public name is importable from ``dra_driver.checkpoint`` as before.
"""

from __future__ import annotations

from dra_driver.checkpoint.format import (
    VERSION,
    Checkpoint,
    checksum,
    decode,
    decode_record,
    encode,
    encode_record,
)
from dra_driver.checkpoint.locks import ClaimBusy, ClaimLockHandle, ClaimLocks
from dra_driver.checkpoint.store import (
    DEFAULT_LOCK_TIMEOUT,
    CheckpointStore,
    CheckpointUntrusted,
    current_boot_id,
)
from dra_driver.records import (
    ClaimEntry,
    ClaimState,
    DieRecord,
    Effect,
    EffectKind,
    HeldDie,
    Mutation,
    Registration,
    StatusRecord,
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
    "HeldDie",
    "Mutation",
    "Registration",
    "StatusRecord",
    "current_boot_id",
    "decode",
    "decode_record",
    "encode",
    "encode_record",
    "held_dies",
    "prepared_per_die",
    "set_state",
]


# The old private name of the checksum, kept for code that writes records by hand (the tests).
_checksum = checksum
