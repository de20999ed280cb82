"""The data-link layout: host pointers and region files in the claim's shm dir.

The aclserver creates every region file in the claim's shm dir and tells the client its name
(HELLO reply tail: the session's staging region; MALLOC_HOST reply tail: a host buffer); the
client maps the file by that name from its own view of the shm dir. The control link only
carries (region, offset, length), encoded as an opaque host pointer::

    host_ptr = HOST_TAG | region_id << OFFSET_BITS | offset        (HOST_TAG = 1 << 60)

Region 0 of a session is its staging region: copies of ordinary host buffers go through its two
halves in chunks (the client fills one half while the server drains the other). Regions 1.. are
``malloc_host`` buffers the client fills in place (zero copy). Region files are named
``<kind>-<server pid>-<n>.buf`` with kind ``staging`` or ``host``.
"""

from __future__ import annotations

__all__ = [
    "HOST_TAG",
    "OFFSET_BITS",
    "REGION_SUFFIX",
    "STAGING_REGION",
    "host_ptr",
    "is_host_ptr",
    "region_name",
    "split_host_ptr",
]

HOST_TAG = 1 << 60
OFFSET_BITS = 36
STAGING_REGION = 0
REGION_SUFFIX = ".buf"
_OFFSET_MASK = (1 << OFFSET_BITS) - 1
_REGION_MASK = (1 << (60 - OFFSET_BITS)) - 1


def host_ptr(region_id: int, offset: int = 0) -> int:
    return HOST_TAG | (region_id << OFFSET_BITS) | offset


def is_host_ptr(ptr: int) -> bool:
    return ptr >= 0 and bool(ptr & HOST_TAG) and ptr < (HOST_TAG << 1)


def split_host_ptr(ptr: int) -> tuple[int, int]:
    """(region_id, offset) of a host pointer."""
    return (ptr >> OFFSET_BITS) & _REGION_MASK, ptr & _OFFSET_MASK


def region_name(kind: str, server_pid: int, serial: int) -> str:
    """The file name of a region (``kind`` is ``staging`` or ``host``)."""
    return f"{kind}-{server_pid}-{serial}{REGION_SUFFIX}"
