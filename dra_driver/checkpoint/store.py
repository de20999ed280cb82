"""The checkpoint store: the per-claim record directory behind a timed cross-process lock.

This module owns :class:`CheckpointStore` — the in-memory index and the generation counter that
keeps it coherent across processes, the one way to change a claim (:meth:`CheckpointStore.update`),
trust and doubt over damaged records — and :class:`CheckpointUntrusted`. The bytes of each file
are ``format.py``'s, the per-claim locks ``locks.py``'s, the version-1 migration ``migration.py``'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

from dra_driver import files
from dra_driver.checkpoint import format as codec
from dra_driver.checkpoint.format import (
    BOOT_FILE,
    RECORD_MAX_BYTES,
    RECORD_RE,
    UNTRUSTED_FILE,
    Checkpoint,
    corrupt,
    decode_small,
    encode_record,
    encode_small,
)
from dra_driver.checkpoint.locks import ClaimLocks
from dra_driver.checkpoint.migration import migrate_v1
from dra_driver.errors import ErrorCode, StateError, Unavailable
from dra_driver.records import ClaimEntry, Mutation

DEFAULT_LOCK_TIMEOUT = 10.0
log = logging.getLogger("flexnpu.checkpoint")


class CheckpointUntrusted(StateError):
    """The checkpoint holds records that cannot be read: nothing may be removed on its word."""

    default_code = ErrorCode.CHECKPOINT_UNTRUSTED


def current_boot_id() -> str:
    return files.boot_id()


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
            migrate_v1(self.path, self.boot_id, self.corrupt_copies)
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
                    boot = str(decode_small(raw, "bootID", source=str(p)))
                elif name == UNTRUSTED_FILE:
                    doubt = str(decode_small(raw, "reason", source=str(p)))[:1000] or "untrusted"
                elif RECORD_RE.match(name):
                    entry = codec.decode_record(raw, source=str(p))
                    if entry.uid != name.removesuffix(".json"):
                        raise corrupt(str(p), f"records claim {entry.uid!r} under another name", "entry.uid")
                    index[entry.uid] = entry
                else:
                    raise corrupt(str(p), "not a file this driver writes")
            except (StateError, OSError) as err:
                bad[name] = str(err)[:400]
        trusted, was = not bad and not doubt, not self._bad and not self._doubt
        if trusted != was or (self._gen is None and not trusted):
            log.log(
                logging.WARNING if trusted else logging.ERROR,
                "checkpoint condition Trusted=%s reason=%s: %s",
                trusted,
                "Readable" if trusted else "DamagedRecords",
                "every record reads"
                if trusted
                else f"{len(bad)} damaged record(s){'; ' + doubt if doubt else ''}",
            )
        for name, why in bad.items():
            if name not in self._bad:
                log.error(
                    "checkpoint record %s cannot be read (%s): nothing is removed until it is adopted or discarded",
                    name,
                    why,
                )
        self._index, self._bad, self._recorded_boot, self._doubt = index, bad, boot, doubt

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
                self._write(BOOT_FILE, encode_small("bootID", cp.boot_id))
                self._recorded_boot = cp.boot_id
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
