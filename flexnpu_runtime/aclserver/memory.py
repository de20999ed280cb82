"""One session's memory calls: device memory, host buffers of the data link, and copies between them.

Owns argument checking and the session's host regions (region 0 is its staging region, 1.. its
``malloc_host`` buffers); the device side is the backend's, the quota the book's (``quota.py``).
Host buffers are bounded across every session of the claim by the claim's host-memory budget
(``hostmem.HostBudget``), never by the device quota. Every failure is an ``AclFailure`` and
changes nothing.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

from flexnpu_runtime.aclserver import datalink
from flexnpu_runtime.aclserver.backend import AclFailure, Backend
from flexnpu_runtime.aclserver.hostmem import HostBudget
from flexnpu_runtime.aclserver.quota import QuotaBook
from flexnpu_wire import codes
from flexnpu_wire import datalink as wire_datalink
from flexnpu_wire import framing as protocol
from flexnpu_wire.framing import Op

__all__ = ["PAGE", "Memory"]

PAGE = 4096
_region_names = itertools.count(1)
_MEM_ATTRS = frozenset(codes.MEM_ATTR_VALUES)
_MEMCPY_KINDS = frozenset(int(k) for k in codes.MemcpyKind)
_EXPECTED_SIDES = {
    codes.MemcpyKind.HOST_TO_HOST: (True, True),
    codes.MemcpyKind.HOST_TO_DEVICE: (True, False),
    codes.MemcpyKind.DEVICE_TO_HOST: (False, True),
    codes.MemcpyKind.DEVICE_TO_DEVICE: (False, False),
}
Handler = Callable[[tuple[int, ...]], tuple[int, ...]]


class Memory:
    """Memory state and calls of one session (``handlers`` for the dispatcher)."""

    def __init__(
        self,
        backend: Backend,
        book: QuotaBook,
        *,
        session_id: int,
        shm_dir: str,
        staging_bytes: int,
        host: HostBudget | None,
        current: Callable[[], int],
        device: Callable[[], int | None],
        unix: bool = False,
    ) -> None:
        self.backend = backend
        self.book = book
        self.session_id = session_id
        self.shm_dir = shm_dir
        self.host = host
        self._current = current
        self._device = device
        self.unix = unix
        self.regions: dict[int, datalink.AnyRegion] = {}
        self._next_region = 1
        self.staging = self._new_region("staging", staging_bytes, wire_datalink.STAGING_REGION)

    def handlers(self) -> dict[Op, Handler]:
        return {
            Op.MALLOC: self._malloc,
            Op.FREE: self._free,
            Op.MEMCPY: self._memcpy,
            Op.MEMSET: self._memset,
            Op.GET_MEM_INFO: self._get_mem_info,
            Op.FREE_HOST: self._free_host,
        }

    # -- device memory -----------------------------------------------------------------------------

    def _malloc(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        size, policy = ints
        return (self.backend.malloc(self._current(), size, policy, owner=self.session_id),)

    def _free(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        self.book.free(ints[0], owner=self.session_id)
        return ()

    def _get_mem_info(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        if ints[0] not in _MEM_ATTRS:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"unknown memory attribute {ints[0]}")
        device = self._device()
        return self.backend.mem_info(self._current() if device is None else device)

    def _memset(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        ptr, dst_max, value, count = ints
        if count < 0 or count > dst_max:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"memset count {count} must be in 0..dst_max ({dst_max})"
            )
        self.backend.memset(ptr, value, count, owner=self.session_id)
        return ()

    def _memcpy(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        dst, dst_max, src, count, kind = ints[:5]
        # A chunk of a staged copy carries the span of the whole remaining copy as a 6th value:
        # the device side is checked for all of it up front, so a bad copy changes nothing.
        span = ints[5] if len(ints) > 5 else count
        if span < count:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"memcpy span {span} is shorter than count {count}"
            )
        if count < 0 or count > dst_max:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"memcpy count {count} must be in 0..dst_max ({dst_max})"
            )
        if kind not in _MEMCPY_KINDS:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"unknown memcpy kind {kind}")
        src_host, dst_host = wire_datalink.is_host_ptr(src), wire_datalink.is_host_ptr(dst)
        if _EXPECTED_SIDES.get(codes.MemcpyKind(kind), (src_host, dst_host)) != (src_host, dst_host):
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"memcpy kind {codes.MemcpyKind(kind).name} does not match the pointers given",
            )
        src_region = self.host_region(src, count) if src_host else None
        dst_region = self.host_region(dst, count) if dst_host else None
        try:
            self.backend.memcpy(
                dst=dst, src=src, count=count, span=span, dst_region=dst_region, src_region=src_region,
                owner=self.session_id,
            )  # fmt: skip
        except OSError as exc:
            # the client truncated or broke its own region file: its copy fails, nothing else
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"memcpy through the data link failed: {exc}"
            ) from exc
        return ()

    # -- host buffers --------------------------------------------------------------------------------

    def malloc_host(self, msg: protocol.Message) -> tuple[tuple[int, ...], bytes]:
        """A host buffer: (host pointer, mapped bytes), its region file name as the reply tail."""
        region = self._host_buffer(msg.ints[0], sealed=False)
        return (wire_datalink.host_ptr(region.region_id), region.size), region.name.encode()

    def malloc_host_fd(self, msg: protocol.Message) -> tuple[tuple[int, ...], int]:
        """A host buffer as a sealed memfd: (host pointer, mapped bytes), and the fd to pass."""
        region = self._host_buffer(msg.ints[0], sealed=True)
        assert isinstance(region, datalink.SealedRegion)
        return (wire_datalink.host_ptr(region.region_id), region.size), region.fd

    def staging_fd(self, _msg: protocol.Message) -> tuple[tuple[int, ...], int]:
        """Replace the staging region with a sealed memfd of the same size; its fd to pass. Asked
        again, it passes the same memfd: a session holds one staging region, never more."""
        self._need_unix()
        old = self.regions[wire_datalink.STAGING_REGION]
        if isinstance(old, datalink.SealedRegion):
            return (old.size,), old.fd
        name = wire_datalink.region_name("staging", os.getpid(), next(_region_names))
        try:
            region = datalink.create_sealed_region(name, old.size, wire_datalink.STAGING_REGION)
        except OSError as exc:
            raise AclFailure(
                codes.ACL_ERROR_BAD_ALLOC, f"cannot create a sealed staging region: {exc}"
            ) from exc
        self.regions[wire_datalink.STAGING_REGION] = self.staging = region
        old.close()
        return (region.size,), region.fd

    def _need_unix(self) -> None:
        if not self.unix:
            raise AclFailure(
                codes.ACL_ERROR_API_NOT_SUPPORT, "sealed memfds are passed only over the unix socket"
            )

    def _host_buffer(self, size: int, *, sealed: bool) -> datalink.AnyRegion:
        if sealed:
            self._need_unix()
        if size <= 0:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"malloc_host size must be positive, got {size}")
        if size >= 1 << wire_datalink.OFFSET_BITS:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"malloc_host size {size} is too large")
        rounded = -(-size // PAGE) * PAGE
        host = self.host
        if host is not None:
            host.reserve(rounded)
        rid = self._next_region
        try:
            if sealed:
                name = wire_datalink.region_name("host", os.getpid(), next(_region_names))
                region: datalink.AnyRegion = datalink.create_sealed_region(name, rounded, rid)
                self.regions[rid] = region
            else:
                region = self._new_region("host", rounded, rid)
        except OSError as exc:
            if host is not None:
                host.release(rounded)
            raise AclFailure(
                codes.ACL_ERROR_BAD_ALLOC, f"cannot create a host buffer of {size} bytes: {exc}"
            ) from exc
        self._next_region += 1
        return region

    def _free_host(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        ptr = ints[0]
        rid, offset = wire_datalink.split_host_ptr(ptr) if wire_datalink.is_host_ptr(ptr) else (-1, -1)
        if rid <= 0 or offset != 0 or rid not in self.regions:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"pointer {ptr:#x} is not a host buffer of this client"
            )
        self.drop_region(rid)
        return ()

    def host_region(self, ptr: int, count: int) -> datalink.AnyRegion:
        """The region ``count`` bytes at host pointer ``ptr`` lie in (AclFailure if they do not)."""
        rid, offset = wire_datalink.split_host_ptr(ptr)
        region = self.regions.get(rid)
        if region is None:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"host pointer {ptr:#x} is not a buffer of this client"
            )
        if count < 0 or offset + count > region.size:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"{count} bytes at host pointer {ptr:#x} run past its buffer ({region.size} bytes)",
            )
        return region

    def drop_region(self, rid: int) -> None:
        region = self.regions.pop(rid)
        region.close()
        if rid != wire_datalink.STAGING_REGION and self.host is not None:
            self.host.release(region.size)

    def drop_host_buffers(self) -> None:
        """Every region but the staging region (aclFinalize)."""
        for rid in [r for r in self.regions if r != wire_datalink.STAGING_REGION]:
            self.drop_region(rid)

    def close(self) -> None:
        """Free the session's device memory and remove every region file."""
        self.book.release_all(owner=self.session_id)
        for rid in list(self.regions):
            self.drop_region(rid)

    def _new_region(self, kind: str, size: int, rid: int) -> datalink.AnyRegion:
        name = wire_datalink.region_name(kind, os.getpid(), next(_region_names))
        region = datalink.create_region(self.shm_dir, name, size, rid)
        self.regions[rid] = region
        return region
