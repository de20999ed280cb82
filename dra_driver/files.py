"""The file primitives every state writer uses: atomic write, no-follow read, timed flock, boot ID.

One implementation each, used by the checkpoint, the daemon registry, the aclserver launch spec
and ready file, ``client.conf`` and the CDI writer. What they guarantee:

* :func:`write_atomic` never leaves a torn file behind. The temp file is created exclusively
  (``O_CREAT|O_EXCL|O_NOFOLLOW``) next to the target, every byte is written (short writes are
  retried, ``ENOSPC`` and other errors raise :class:`WriteFailed` after the temp file is removed),
  the file and then its directory are fsynced, and the rename replaces the target in one step. A
  failed write leaves the previous file exactly as it was. A symlink at the target is replaced,
  never written through.
* :func:`read_nofollow` refuses symlinks (``O_NOFOLLOW``) and non-regular files, and bounds the
  size it reads.
* :func:`locked` takes an exclusive ``flock`` with a deadline, so a stuck holder produces a clear
  :class:`LockTimeout` instead of a hang.

This module knows nothing about claims; callers translate :class:`FileError` into their own
errors (see ``dra_driver/errors.py``) with the claim UID and field.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "FileError",
    "LockTimeout",
    "NotRegular",
    "WriteFailed",
    "boot_id",
    "fsync_dir",
    "fsync_file",
    "locked",
    "read_nofollow",
    "remove_nofollow",
    "write_atomic",
]

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
DEFAULT_MAX_READ = 64 << 20


class FileError(OSError):
    """Base of this module's errors; ``errno`` and ``filename`` are set as for :class:`OSError`."""


class WriteFailed(FileError):
    """A write did not complete (``ENOSPC``, ``EIO``, a short write that made no progress, …).

    The target file is unchanged and no temp file is left behind.
    """


class NotRegular(FileError):
    """The path is a symlink, a directory, a device or a socket where a regular file was expected."""


class LockTimeout(FileError):
    """The lock was not acquired within its deadline."""


def write_atomic(
    path: Path,
    data: bytes,
    *,
    mode: int = 0o600,
    sync: bool = True,
    dir_mode: int | None = None,
) -> None:
    """Replace ``path`` with ``data`` in one step; the old content survives any failure.

    ``mode`` is set on the new file exactly (not filtered by the umask). With ``dir_mode`` the
    parent directory is created if missing (never through a symlink). With ``sync=False`` the file
    is not fsynced (visible at once, durable only after a later :func:`fsync_dir` and file sync):
    use it only for files that can be rebuilt.
    """
    parent = path.parent
    if dir_mode is not None:
        _mkdir_nofollow(parent, dir_mode)
    tmp = parent / f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        raise WriteFailed(
            exc.errno, f"cannot create a temp file next to {path}: {exc.strerror}", str(path)
        ) from exc
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                if n <= 0:
                    raise WriteFailed(errno.EIO, f"short write to {path} made no progress", str(path))
                view = view[n:]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except WriteFailed:
        _unlink_quiet(tmp)
        raise
    except OSError as exc:
        _unlink_quiet(tmp)
        raise WriteFailed(exc.errno, f"cannot write {path}: {exc.strerror}", str(path)) from exc
    if sync:
        try:
            fsync_dir(parent)
        except OSError as exc:
            raise WriteFailed(
                exc.errno, f"cannot sync the directory of {path}: {exc.strerror}", str(path)
            ) from exc


def fsync_dir(directory: Path) -> None:
    """fsync a directory, so that a rename or unlink in it is durable."""
    _fsync(directory, os.O_DIRECTORY)


def fsync_file(path: Path) -> None:
    """Make an earlier ``write_atomic(..., sync=False)`` of ``path`` durable: the file, then its directory.

    ``path`` itself is never followed if it is a symlink (ELOOP).
    """
    _fsync(path, os.O_NOFOLLOW)
    fsync_dir(path.parent)


def _fsync(path: Path, flags: int) -> None:
    """The one fsync: open read-only with ``flags``, fsync, close."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_nofollow(path: Path, *, max_bytes: int = DEFAULT_MAX_READ) -> bytes:
    """The content of the regular file ``path``; refuses symlinks, non-regular files and oversize files.

    Raises :class:`FileNotFoundError` if it does not exist (so callers can tell absence apart),
    :class:`NotRegular` for a symlink or a non-regular file, :class:`FileError` if it is larger than
    ``max_bytes``.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegular(errno.ELOOP, f"{path} is a symlink; refusing to follow it", str(path)) from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(errno.EINVAL, f"{path} is not a regular file", str(path))
        if st.st_size > max_bytes:
            raise FileError(errno.EFBIG, f"{path} is {st.st_size} bytes, more than {max_bytes}", str(path))
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        out = b"".join(chunks)
        if len(out) > max_bytes:
            raise FileError(errno.EFBIG, f"{path} grew past {max_bytes} bytes while being read", str(path))
        return out
    finally:
        os.close(fd)


def remove_nofollow(path: Path) -> bool:
    """Unlink ``path`` itself (a symlink is removed, never its target); whether it existed."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


@contextlib.contextmanager
def locked(path: Path, *, timeout: float, poll: float = 0.005, mode: int = 0o600) -> Iterator[int]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing, never through a symlink).

    Raises :class:`LockTimeout` if it is not acquired within ``timeout`` seconds. Yields the fd.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        deadline = time.monotonic() + timeout
        delay = poll
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
                if now >= deadline:
                    raise LockTimeout(
                        errno.EWOULDBLOCK, f"lock {path} not acquired within {timeout:g} s", str(path)
                    ) from None
                time.sleep(
                    min(delay, deadline - now)
                )  # backoff while another holder works; not test synchronisation
                delay = min(delay * 2, 0.05)
        try:
            yield fd
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The kernel's boot ID (changes at every boot), or ``""`` where it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _mkdir_nofollow(directory: Path, mode: int) -> None:
    """Create ``directory`` and missing parents with ``mode``; refuse a symlink or a non-directory."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        if directory.parent != directory:
            _mkdir_nofollow(directory.parent, mode)
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, mode)
        st = os.lstat(directory)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise NotRegular(
            errno.ENOTDIR, f"{directory} is not a directory (a symlink?); refusing to use it", str(directory)
        )


def _unlink_quiet(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
