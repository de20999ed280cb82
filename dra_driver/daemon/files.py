"""Files the daemon owns on disk: atomic writes, and a claim's shm dir, spec and ready file.

Nothing here knows about processes; ``manager`` decides when to create or remove.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dra_driver.daemon.spec import ClaimPaths


def write_atomic(path: Path, data: bytes, *, mode: int = 0o600, sync: bool = True) -> None:
    """Write ``data`` to ``path`` via a temp file and rename; with ``sync``, fsync file and directory.

    Without ``sync`` the new content is visible at once (it survives a crash of this process)
    but is only durable after :func:`sync`, which callers may run while other work proceeds.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync:
        _fsync_dir(path.parent)


def sync(path: Path) -> None:
    """Make an earlier ``write_atomic(..., sync=False)`` of ``path`` durable (file and directory)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_spec(path: Path, spec: Mapping[str, Any]) -> None:
    """Write the aclserver launch spec (mode 0600: it holds the claim's token).

    Not fsynced: the run dir is volatile by design, and a spec is rewritten at every start.
    """
    write_atomic(path, json.dumps(spec, indent=1, sort_keys=True).encode(), sync=False)


def prepare_shm_dir(paths: ClaimPaths, *, ledger_dir: Path) -> None:
    """Create the claim's shm dir (and the shared ledger dir); remove a stale socket and ready file."""
    ledger_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    paths.shm_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    for stale in (paths.unix_socket, paths.ready):
        stale.unlink(missing_ok=True)


def read_ready(path: Path) -> dict[str, Any] | None:
    """The aclserver's ready document, or None if it is not (completely) written yet."""
    try:
        doc = json.loads(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


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
    """Remove the claim's shm dir, spec, ready file and captured stderr (missing is fine)."""
    shutil.rmtree(paths.shm_dir, ignore_errors=True)
    for f in paths.files():
        f.unlink(missing_ok=True)
