"""The server side of the data link: region files in the claim's shm dir, read and written by fd.

The layout (host pointers, region names) is the contract in ``client/flexnpu_wire/datalink.py``.
The aclserver creates every region file itself (``O_EXCL|O_NOFOLLOW``, so it never opens a file
a client planted), allocates its pages up front (first touch of a /dev/shm page is ~30x slower
than a warm copy) and removes it when the session ends. The client maps the file by name.

The server never maps a region *file*: it copies with ``preadv``/``pwritev`` on its own fd. A
client that truncates or resizes its region file therefore gets an ACL error for the copy (a
short read), never a SIGBUS in the aclserver; growing the file only spends the claim's own shm
space, which the daemon bounds with a per-claim tmpfs (``flexnpu_runtime/daemon/shmfs.py``).

A client on the unix socket gets its staging region and host buffers as **sealed memfds**
instead (``create_sealed_region``; ops STAGING_FD, MALLOC_HOST_FD, the fd passed with
SCM_RIGHTS): the server creates the memfd, sizes and pre-allocates it, seals it against
shrinking and growing (``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``) and maps it, so copies run
at memcpy speed through the mapping while no client can make it shorter than the mapping (a
hole it punches reads back as zeros, never a SIGBUS). Both kinds have the same interface.

A client holds its own fd of every memfd it was passed, so closing the server's fd and mapping
frees nothing while the client keeps it. When the server is done with a sealed region (the host
buffer is freed, the staging region replaced, the session ends) it therefore punches the whole
memfd (``MADV_REMOVE``): its pages go back to the node whoever still holds the fd, and what a
client still maps reads as zeros. A client that writes into it again allocates fresh pages charged
to its own memory cgroup, never to the aclserver's. So a sealed region is charged to the claim's
host-memory budget exactly while the server holds it (``hostmem.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
from dataclasses import dataclass, field

__all__ = [
    "REGION_MODE",
    "AnyRegion",
    "Region",
    "RegionTruncated",
    "SealedRegion",
    "create_region",
    "create_sealed_region",
]

REGION_MODE = 0o666
"""Region files are read-write for any uid: the container's processes may run as any user and
must map them (MAP_SHARED, read and write). Only the claim's own shm dir is mounted into its
pods, and the directory is the claim's own tmpfs, so no other tenant can reach them."""


class RegionTruncated(OSError):
    """A region file is shorter than the bytes a copy needs (its client truncated it)."""


@dataclass(slots=True)
class Region:
    """One region file (server side): an fd, never a mapping."""

    region_id: int
    path: str
    size: int
    fd: int

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def read_into(self, offset: int, dest: memoryview) -> None:
        """Fill ``dest`` with the region's bytes at ``offset`` (RegionTruncated on a short read)."""
        done, want = 0, dest.nbytes
        while done < want:
            got = os.preadv(self.fd, [dest[done:]], offset + done)
            if got <= 0:
                raise RegionTruncated(
                    f"region {self.name} ends {offset + done} bytes in, {want - done} bytes short"
                    " (was the file truncated?)"
                )
            done += got

    def write_from(self, offset: int, src: memoryview) -> None:
        """Write ``src`` into the region at ``offset``."""
        done, want = 0, src.nbytes
        while done < want:
            done += os.pwritev(self.fd, [src[done:]], offset + done)

    def close(self, *, unlink: bool = True) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


@dataclass(slots=True, eq=False)
class SealedRegion:
    """One region as a sealed memfd the server maps (see the module docstring)."""

    region_id: int
    size: int
    fd: int
    mm: mmap.mmap
    view: memoryview = field(init=False)
    name: str = ""

    def __post_init__(self) -> None:
        self.view = memoryview(self.mm)

    def read_into(self, offset: int, dest: memoryview) -> None:
        dest[:] = self.view[offset : offset + dest.nbytes]

    def write_from(self, offset: int, src: memoryview) -> None:
        self.view[offset : offset + src.nbytes] = src

    def close(self, *, unlink: bool = True) -> None:
        """Reclaim the memfd's pages (also those a client's fd or mapping still holds), unmap, close."""
        with contextlib.suppress(OSError, ValueError):
            self.mm.madvise(mmap.MADV_REMOVE)
        self.view.release()
        with contextlib.suppress(BufferError):  # a copy's view still alive: unmapped when it goes
            self.mm.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


def create_sealed_region(name: str, size: int, region_id: int) -> SealedRegion:
    """A memfd of ``size`` bytes, allocated up front, sealed against shrinking and growing, mapped."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        os.posix_fallocate(fd, 0, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    except BaseException:
        os.close(fd)
        raise
    return SealedRegion(region_id, size, fd, mm, name=name)


AnyRegion = Region | SealedRegion
"""Either kind of region (both read, write and close alike)."""


def create_region(directory: str, name: str, size: int, region_id: int) -> Region:
    """Create, size and pre-allocate a region file (mode ``REGION_MODE``; see there why)."""
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, REGION_MODE)
        os.posix_fallocate(fd, 0, size)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    return Region(region_id, path, size, fd)
