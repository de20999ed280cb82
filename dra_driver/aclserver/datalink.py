"""The server side of the data link: region files in the claim's shm dir, read and written by fd.

The layout (host pointers, region names) is the contract in ``client/flexnpu_wire/datalink.py``;
its names are re-exported here only as documented aliases for the old import path.
The aclserver creates every region file itself (``O_EXCL|O_NOFOLLOW``, so it never opens a file
a client planted), allocates its pages up front (first touch of a /dev/shm page is ~30x slower
than a warm copy) and removes it when the session ends. The client maps the file by name.

The server never maps a region: it copies with ``preadv``/``pwritev`` on its own fd. A client
that truncates or resizes its region file therefore gets an ACL error for the copy (a short
read), never a SIGBUS in the aclserver; growing the file only spends the claim's own shm space,
which the daemon bounds with a per-claim tmpfs (``dra_driver/daemon/files.py``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from flexnpu_wire.datalink import (
    HOST_TAG,
    OFFSET_BITS,
    REGION_SUFFIX,
    STAGING_REGION,
    host_ptr,
    is_host_ptr,
    region_name,
    split_host_ptr,
)

__all__ = [
    "HOST_TAG",
    "OFFSET_BITS",
    "REGION_MODE",
    "REGION_SUFFIX",
    "STAGING_REGION",
    "Region",
    "RegionTruncated",
    "create_region",
    "host_ptr",
    "is_host_ptr",
    "region_name",
    "split_host_ptr",
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
