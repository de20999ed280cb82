"""Files the daemon owns on disk: a claim's shm dir, its captured stderr, and their removal.

Atomic writes and fsyncs are ``dra_driver/files.py``'s; the launch spec and the ready file are
written and read in one call each through ``dra_driver/wirefiles.py``. Nothing here knows about
processes; ``manager`` decides when to create or remove.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from pathlib import Path

from dra_driver import files
from flexnpu_runtime.daemon import shmfs
from flexnpu_runtime.daemon.launch_spec import ClaimPaths


def prepare_shm_dir(paths: ClaimPaths, *, ledger_dir: Path, tmpfs_bytes: int | None = None) -> None:
    """Create the claim's shm dir (and the shared ledger dir); remove a stale socket and ready file.

    A symlink (or any non-directory) where the shm dir belongs is removed, never followed. With
    ``tmpfs_bytes`` the dir becomes its own tmpfs of that size (``flexnpu_runtime/daemon/shmfs.py``).
    """
    ledger_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(paths.shm_dir)
        if not stat.S_ISDIR(st.st_mode):
            files.remove_nofollow(paths.shm_dir)
    paths.shm_dir.mkdir(parents=True, exist_ok=True, mode=0o711)
    if tmpfs_bytes is not None:
        shmfs.mount(paths.shm_dir, size_bytes=tmpfs_bytes)
    for stale in (paths.unix_socket, paths.ready, paths.sessions):
        stale.unlink(missing_ok=True)


def stderr_tail(path: Path, limit: int = 2000) -> str:
    """The last ``limit`` characters of a captured stderr file ("" if none)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            return fh.read().decode(errors="replace").strip()
    except FileNotFoundError:
        return ""


def remove_claim_files(paths: ClaimPaths) -> None:
    """Remove the claim's shm dir (unmounting its tmpfs), spec, ready and sessions files, and
    retire its captured stderr (missing is fine; a symlink is removed, never followed)."""
    with contextlib.suppress(OSError):
        if shmfs.is_mount(paths.shm_dir):  # emptied first: a copy of the mount elsewhere keeps nothing
            shutil.rmtree(paths.shm_dir, ignore_errors=True)
        shmfs.unmount_all_under(paths.shm_dir)
    try:
        st = os.lstat(paths.shm_dir)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        files.remove_nofollow(paths.shm_dir)
    else:
        shutil.rmtree(paths.shm_dir, ignore_errors=True)
    for f in paths.files():
        if f != paths.stderr:
            f.unlink(missing_ok=True)
    retire_stderr(paths.stderr)


RETIRED_DIR = "retired"
RETIRED_KEEP = 128
"""How many retired stderr files are kept (the oldest go first)."""


def retire_stderr(path: Path, *, keep: int = RETIRED_KEEP) -> Path | None:
    """Move an aclserver's captured stderr into ``retired/`` beside it, for the operator, as
    ``<uid>.<UTC time>.stderr.log``; keep the newest ``keep`` there. The new path (None if none)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        files.remove_nofollow(path)
        return None
    retired = path.parent / RETIRED_DIR
    retired.mkdir(mode=0o700, exist_ok=True)
    uid = path.name.split(".", 1)[0]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(st.st_mtime))
    target = retired / f"{uid}.{stamp}.stderr.log"
    n = 1
    while target.exists():
        target = retired / f"{uid}.{stamp}.{n}.stderr.log"
        n += 1
    os.replace(path, target)
    kept: list[tuple[float, Path]] = []
    for entry in retired.iterdir():  # another claim's unregister may prune at the same time
        with contextlib.suppress(FileNotFoundError):
            kept.append((entry.lstat().st_mtime, entry))
    kept.sort()
    for _, extra in kept[: max(0, len(kept) - keep)]:
        extra.unlink(missing_ok=True)
    return target
