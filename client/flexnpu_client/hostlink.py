"""The data link of one session as the client holds it: host memory shared with the aclserver.

Bulk bytes never travel on the socket. Each session has a staging region (on the unix socket a
sealed memfd the server passes, else a region file in the claim's shm dir) through which a
buffer object is copied in chunks, pipelined over its two halves; ``malloc_host`` buffers are
regions of their own, mapped in this process, that memcpy reads and writes in place (zero
copy). ``session.Session`` is the API over it; the requests go over the session's control link
(``transport.SocketTransport``).
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable

from flexnpu_client import transport
from flexnpu_client.errors import AclError
from flexnpu_wire import datalink
from flexnpu_wire import framing as protocol
from flexnpu_wire.codes import ACL_ERROR_API_NOT_SUPPORT, ACL_ERROR_INVALID_PARAM, MemcpyKind
from flexnpu_wire.ops import Op

__all__ = ["HostLink", "byte_view", "check"]

Frame = Callable[[int, int, int], tuple[int, tuple[int, ...]]]
"""``frame(done, host_ptr, n)``: the request that hands the server ``n`` staged bytes at offset ``done``."""


def check(reply: protocol.Message) -> tuple[int, ...]:
    """A reply's output values (AclError on a non-zero ACL code)."""
    if reply.ints[0] != 0:
        raise AclError(reply.ints[0], reply.tail.decode(errors="replace"))
    return reply.ints[1:]


class _Mapping:
    """A region of the data link mapped in this process: a region file by path, or a memfd."""

    def __init__(self, path: str | None, size: int, *, fd: int = -1) -> None:
        if path is not None:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            self.mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        finally:
            os.close(fd)
        self.size = size
        self.view = memoryview(self.mm)

    def close(self) -> None:
        self.view.release()
        with contextlib.suppress(
            BufferError
        ):  # a view handed to the caller is still alive; unmapped when collected
            self.mm.close()


class HostLink:
    """The staging region and the host buffers of one session (see the module docstring)."""

    def __init__(self, link: transport.SocketTransport, shm_dir: str, staging: tuple[str, int]) -> None:
        """``staging``: the region file's name and size as HELLO answered them (the fallback to a
        sealed memfd)."""
        self.link = link
        self._shm_dir = shm_dir
        self._staging = self._sealed_staging() or _Mapping(os.path.join(shm_dir, staging[0]), staging[1])
        self._regions: dict[int, _Mapping] = {0: self._staging}

    def _sealed_staging(self) -> _Mapping | None:
        """On the unix socket: the staging region as a sealed memfd the server maps (copies at
        memcpy speed); None from a server or link that cannot pass one."""
        if self.link.kind != "unix":
            return None
        rid, reply = self.link.request_id(Op.STAGING_FD)
        if reply.ints[0] != 0:
            return None
        return _Mapping(None, reply.ints[1], fd=self.link.take_fd(rid))

    def close(self) -> None:
        for region in self._regions.values():
            region.close()
        self._regions.clear()

    # -- host buffers ------------------------------------------------------------------------------

    def malloc_host(self, size: int) -> int:
        """A host buffer mapped here and in the server: a sealed memfd on the unix socket, else
        (or from a server that cannot pass one) a region file."""
        if self.link.kind == "unix":
            rid, reply = self.link.request_id(Op.MALLOC_HOST_FD, (size,))
            if reply.ints[0] == 0:
                ptr, mapped = reply.ints[1], reply.ints[2]
                self._regions[datalink.split_host_ptr(ptr)[0]] = _Mapping(
                    None, mapped, fd=self.link.take_fd(rid)
                )
                return ptr
            if reply.ints[0] != ACL_ERROR_API_NOT_SUPPORT:
                check(reply)
        reply = self.link.request(Op.MALLOC_HOST, (size,))
        check(reply)
        ptr, mapped = reply.ints[1], reply.ints[2]
        rid, _ = datalink.split_host_ptr(ptr)
        self._regions[rid] = _Mapping(os.path.join(self._shm_dir, reply.tail.decode()), mapped)
        return ptr

    def free_host(self, ptr: int) -> None:
        check(self.link.request(Op.FREE_HOST, (ptr,)))
        rid, _ = datalink.split_host_ptr(ptr)
        region = self._regions.pop(rid, None)
        if region is not None:
            region.close()

    def unmap_host_buffers(self) -> None:
        """Unmap every host buffer (the server freed them: FINALIZE); the staging region stays."""
        for rid in [r for r in self._regions if r != 0]:
            self._regions.pop(rid).close()

    def host_view(self, ptr: int, size: int | None = None) -> memoryview:
        """A writable view of a malloc_host buffer (from ``ptr``, ``size`` bytes or to its end)."""
        rid, offset = datalink.split_host_ptr(ptr) if datalink.is_host_ptr(ptr) else (-1, 0)
        region = self._regions.get(rid) if rid > 0 else None
        if region is None:
            raise AclError(ACL_ERROR_INVALID_PARAM, f"{ptr:#x} is not a host buffer of this session")
        end = region.size if size is None else offset + size
        if end > region.size:
            raise AclError(ACL_ERROR_INVALID_PARAM, f"{size} bytes at {ptr:#x} run past the host buffer")
        return region.view[offset:end]

    # -- copies of buffer objects ------------------------------------------------------------------

    def copy_in(self, dst: int, src: object, count: int, kind: int) -> None:
        """memcpy from a buffer object to ``dst`` (device memory or a host buffer)."""
        if kind not in (MemcpyKind.HOST_TO_DEVICE, MemcpyKind.DEFAULT, MemcpyKind.HOST_TO_HOST):
            raise AclError(ACL_ERROR_INVALID_PARAM, f"memcpy kind {kind} does not match a host buffer as src")
        dst_kind = MemcpyKind.HOST_TO_HOST if datalink.is_host_ptr(dst) else MemcpyKind.HOST_TO_DEVICE
        src_view = byte_view(src, writable=False)
        check_len(src_view, count, "src")
        self.send(
            src_view, count,
            lambda done, host, n: (Op.MEMCPY, (dst + done, count - done, host, n, dst_kind, count - done)),
        )  # fmt: skip

    def send(self, src: memoryview, count: int, frame: Frame) -> None:
        """Send ``count`` bytes of ``src`` through the two halves of the staging region, pipelined:
        the client fills one half while the server drains the other (``frame``: each chunk's request)."""
        half = self._staging.size // 2
        stage = self._staging.view
        link = self.link
        with link.lock:
            pending: int | None = None
            done, k = 0, 0
            while True:
                n = min(half, count - done)
                off = (k % 2) * half
                stage[off : off + n] = src[done : done + n]
                rid = link.send(*frame(done, datalink.host_ptr(0, off), n))
                if pending is not None:
                    self._check_or_drain(link.receive(pending), True, rid)
                pending = rid
                done += n
                k += 1
                if done >= count:
                    break
            check(link.receive(pending))

    def copy_out(self, dst: object, src: int, count: int, kind: int) -> None:
        """memcpy from ``src`` (device memory or a host buffer) to a buffer object, through the two
        staging halves: the server fills one while the client drains the other."""
        if kind not in (MemcpyKind.DEVICE_TO_HOST, MemcpyKind.DEFAULT, MemcpyKind.HOST_TO_HOST):
            raise AclError(ACL_ERROR_INVALID_PARAM, f"memcpy kind {kind} does not match a host buffer as dst")
        src_kind = MemcpyKind.HOST_TO_HOST if datalink.is_host_ptr(src) else MemcpyKind.DEVICE_TO_HOST
        dst_view = byte_view(dst, writable=True)
        check_len(dst_view, count, "dst")
        half = self._staging.size // 2
        stage = self._staging.view
        link = self.link
        chunks = [(d, min(half, count - d)) for d in range(0, count, half)] or [(0, 0)]
        with link.lock:
            rid = link.send(Op.MEMCPY, (datalink.host_ptr(0, 0), half, src, chunks[0][1], src_kind, count))
            for k, (done, n) in enumerate(chunks):
                reply = link.receive(rid)
                if k + 1 < len(chunks):
                    nxt_done, nxt_n = chunks[k + 1]
                    nxt_off = ((k + 1) % 2) * half
                    rid = link.send(
                        Op.MEMCPY,
                        (
                            datalink.host_ptr(0, nxt_off),
                            half,
                            src + nxt_done,
                            nxt_n,
                            src_kind,
                            count - nxt_done,
                        ),
                    )
                self._check_or_drain(reply, k + 1 < len(chunks), rid)
                off = (k % 2) * half
                dst_view[done : done + n] = stage[off : off + n]

    def _check_or_drain(self, reply: protocol.Message, more: bool, next_rid: int) -> None:
        if reply.ints[0] != 0:
            if more:
                self.link.receive(next_rid)
            check(reply)


def byte_view(data: object, *, writable: bool) -> memoryview:
    """``data`` as a flat byte view (AclError if it is not a C-contiguous buffer, or read-only
    where it is written)."""
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise AclError(
            ACL_ERROR_INVALID_PARAM,
            f"a host side must be a buffer or a host pointer, got {type(data).__name__}",
        ) from None
    if not view.c_contiguous:
        raise AclError(ACL_ERROR_INVALID_PARAM, "a host buffer must be C-contiguous")
    if writable and view.readonly:
        raise AclError(ACL_ERROR_INVALID_PARAM, "the destination host buffer is read-only")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def check_len(view: memoryview, count: int, name: str) -> None:
    if view.nbytes < count:
        raise AclError(
            ACL_ERROR_INVALID_PARAM,
            f"memcpy count {count} exceeds the {name} host buffer ({view.nbytes} bytes)",
        )
