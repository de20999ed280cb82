"""The data link: pre-touched shared-memory regions in the claim's shm dir.

The aclserver creates every region file (so it never maps a file a client sized), allocates
its pages up front (first touch of a /dev/shm page is ~30x slower than a warm copy), and removes
it when the connection ends. The client maps the same file by name from its own view of the
shm dir. The control socket only carries (region, offset, length).

Host pointers are opaque ints: ``HOST_TAG | region_id << OFFSET_BITS | offset``. Region 0 of a
connection is its staging region (copies of ordinary host buffers go through it in chunks);
regions 1.. are ``malloc_host`` buffers that the client fills in place (zero copy).
"""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass, field

__all__ = ["HOST_TAG", "OFFSET_BITS", "Region", "create_region", "host_ptr", "is_host_ptr", "split_host_ptr"]

HOST_TAG = 1 << 60
OFFSET_BITS = 36
_OFFSET_MASK = (1 << OFFSET_BITS) - 1
_REGION_MASK = (1 << (60 - OFFSET_BITS)) - 1


def host_ptr(region_id: int, offset: int = 0) -> int:
    return HOST_TAG | (region_id << OFFSET_BITS) | offset


def is_host_ptr(ptr: int) -> bool:
    return ptr >= 0 and bool(ptr & HOST_TAG) and ptr < (HOST_TAG << 1)


def split_host_ptr(ptr: int) -> tuple[int, int]:
    """(region_id, offset) of a host pointer."""
    return (ptr >> OFFSET_BITS) & _REGION_MASK, ptr & _OFFSET_MASK


@dataclass(slots=True)
class Region:
    """One mapped region file (server side)."""

    region_id: int
    path: str
    size: int
    mm: mmap.mmap
    view: memoryview = field(init=False)

    def __post_init__(self) -> None:
        self.view = memoryview(self.mm)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def close(self, *, unlink: bool = True) -> None:
        self.view.release()
        with contextlib.suppress(
            BufferError
        ):  # a slice is still referenced somewhere; the mapping goes when it is collected
            self.mm.close()
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def create_region(directory: str, name: str, size: int, region_id: int) -> Region:
    """Create, size, pre-touch and map a region file (0666: the container may run as any user)."""
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o666)
        os.posix_fallocate(fd, 0, size)
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return Region(region_id, path, size, mm)
