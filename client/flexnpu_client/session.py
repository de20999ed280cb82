"""The object API of the client library: one ``Session`` per connection to the claim's aclserver.

Every method raises ``AclError`` for a non-zero ACL code. Host data for memcpy is either a
``malloc_host`` pointer (the buffer lives in shared memory: zero copy) or any buffer object
(bytes, bytearray, memoryview, numpy array), which is copied through the connection's staging
region in chunks. Bulk bytes never travel on the socket.

Usage::

    with Session.open() as s:        # $FLEXNPU_CONF or /etc/flexnpu/client.conf
        s.init(); s.set_device(0)
        ptr = s.malloc(1 << 20)
        s.memcpy(ptr, 1 << 20, b"x" * 1024, 1024, MemcpyKind.HOST_TO_DEVICE)
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from flexnpu_client import transport
from flexnpu_client.errors import AclError, ConfigError, ConnectError
from flexnpu_wire import clientconf, datalink, modelfile
from flexnpu_wire import framing as protocol
from flexnpu_wire.clientconf import ClientConf
from flexnpu_wire.codes import (
    ACL_ERROR_API_NOT_SUPPORT,
    ACL_ERROR_INVALID_PARAM,
    ACL_ERROR_READ_MODEL_FAILURE,
    MemAttr,
    MemcpyKind,
)
from flexnpu_wire.errors import ContractError
from flexnpu_wire.ops import Op

__all__ = ["HostData", "ModelData", "Session"]

_GET_MEM_INFO = int(Op.GET_MEM_INFO)
_HBM_MEM = int(MemAttr.HBM_MEM)

HostData = Any
"""A host side of memcpy: a malloc_host pointer (int) or a buffer object (bytes, numpy array, ...)."""
ModelData = Any
"""A model's bytes: a file path, a buffer object, or (malloc_host pointer, size)."""
_PAIR = struct.Struct(">qq")


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


class Session:
    """A connection to the aclserver of one claim (see the module docstring)."""

    def __init__(self, conf: ClientConf, link: transport.SocketTransport) -> None:
        self.conf = conf
        self.link = link
        self._regions: dict[int, _Mapping] = {}
        reply = link.request(Op.HELLO, (protocol.PROTOCOL_VERSION, os.getpid()), conf.token.encode())
        if reply.ints[0] != 0:
            link.close()
            raise ConnectError(
                f"aclserver refused the connection: {reply.tail.decode(errors='replace')}"
                f" (ACL {reply.ints[0]})",
                claim_uid=conf.claim_uid,
                ret=reply.ints[0],
            )
        _ret, self.server_pid, self.device_count_hint, staging_size = reply.ints
        self._staging = self._sealed_staging() or _Mapping(
            os.path.join(conf.shm_dir, reply.tail.decode()), staging_size
        )
        self._regions[0] = self._staging

    def _sealed_staging(self) -> _Mapping | None:
        """On the unix socket: the staging region as a sealed memfd the server maps (copies at
        memcpy speed); None from a server or link that cannot pass one."""
        if self.link.kind != "unix":
            return None
        rid, reply = self.link.request_id(Op.STAGING_FD)
        if reply.ints[0] != 0:
            return None
        return _Mapping(None, reply.ints[1], fd=self.link.take_fd(rid))

    @classmethod
    def open(
        cls,
        conf: ClientConf | str | os.PathLike[str] | None = None,
        *,
        prefer: str = "unix",
        timeout: float = 5.0,
    ) -> Session:
        """Connect using a ClientConf, a client.conf path, or $FLEXNPU_CONF / the default path."""
        if not isinstance(conf, ClientConf):
            try:
                conf = clientconf.load(conf)
            except ContractError as exc:
                raise ConfigError.of(exc) from exc
        link = transport.connect(conf, timeout=timeout, prefer=prefer)
        try:
            return cls(conf, link)
        except BaseException:
            link.close()
            raise

    @property
    def transport_kind(self) -> str:
        """ "unix" or "tcp"."""
        return self.link.kind

    def close(self) -> None:
        for region in self._regions.values():
            region.close()
        self._regions.clear()
        self.link.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- calls ------------------------------------------------------------------------------------

    def call(self, op: int, *ints: int, tail: bytes = b"") -> tuple[int, ...]:
        """Send one op; return its output values (AclError on a non-zero code)."""
        reply = self.link.request(op, ints, tail)
        if reply.ints[0] != 0:
            raise AclError(reply.ints[0], reply.tail.decode(errors="replace"))
        return reply.ints[1:]

    def ping(self) -> int:
        """The aclserver's pid (PING needs no authentication)."""
        return self.link.request(Op.PING).ints[1]

    def init(self) -> None:
        self.call(Op.INIT)

    def finalize(self) -> None:
        self.call(Op.FINALIZE)
        for rid in [r for r in self._regions if r != 0]:
            self._regions.pop(rid).close()

    def get_device_count(self) -> int:
        return self.call(Op.GET_DEVICE_COUNT)[0]

    def set_device(self, device: int) -> None:
        self.call(Op.SET_DEVICE, device)

    def reset_device(self, device: int) -> None:
        self.call(Op.RESET_DEVICE, device)

    def get_device(self) -> int:
        return self.call(Op.GET_DEVICE)[0]

    def malloc(self, size: int, policy: int = 0) -> int:
        return self.call(Op.MALLOC, size, policy)[0]

    def free(self, ptr: int) -> None:
        self.call(Op.FREE, ptr)

    def get_mem_info(self, attr: int = _HBM_MEM) -> tuple[int, int]:
        """(free, total) of the current device: total is the claim's memory quota, free what all
        of its sessions leave."""
        reply = self.link.request(_GET_MEM_INFO, (int(attr),))
        ints = reply.ints
        if ints[0] != 0:
            raise AclError(ints[0], reply.tail.decode(errors="replace"))
        return ints[1], ints[2]

    def memset(self, ptr: int, dst_max: int, value: int, count: int) -> None:
        self.call(Op.MEMSET, ptr, dst_max, value, count)

    def malloc_host(self, size: int) -> int:
        """A host buffer in shared memory; ``host_view`` gives its bytes. memcpy from it is zero-copy.
        On the unix socket it is a sealed memfd the server maps too; on TCP a region file."""
        if self.link.kind == "unix":
            rid, reply = self.link.request_id(Op.MALLOC_HOST_FD, (size,))
            if reply.ints[0] == 0:
                ptr, mapped = reply.ints[1], reply.ints[2]
                self._regions[datalink.split_host_ptr(ptr)[0]] = _Mapping(
                    None, mapped, fd=self.link.take_fd(rid)
                )
                return ptr
            if reply.ints[0] != ACL_ERROR_API_NOT_SUPPORT:
                raise AclError(reply.ints[0], reply.tail.decode(errors="replace"))
        reply = self.link.request(Op.MALLOC_HOST, (size,))
        if reply.ints[0] != 0:
            raise AclError(reply.ints[0], reply.tail.decode(errors="replace"))
        ptr, mapped = reply.ints[1], reply.ints[2]
        rid, _ = datalink.split_host_ptr(ptr)
        self._regions[rid] = _Mapping(os.path.join(self.conf.shm_dir, reply.tail.decode()), mapped)
        return ptr

    def free_host(self, ptr: int) -> None:
        self.call(Op.FREE_HOST, ptr)
        rid, _ = datalink.split_host_ptr(ptr)
        region = self._regions.pop(rid, None)
        if region is not None:
            region.close()

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

    def memcpy(self, dst: HostData, dst_max: int, src: HostData, count: int, kind: int) -> None:
        """aclrtMemcpy; device sides are ints, host sides a malloc_host pointer or a buffer."""
        kind = MemcpyKind(kind) if kind in MemcpyKind.__members__.values() else kind
        if isinstance(dst, int) and isinstance(src, int):
            self.call(Op.MEMCPY, dst, dst_max, src, count, kind)
            return
        if count < 0 or count > dst_max:
            raise AclError(ACL_ERROR_INVALID_PARAM, f"memcpy count {count} must be in 0..dst_max ({dst_max})")
        if not isinstance(dst, int) and not isinstance(src, int):
            dst_view = _byte_view(dst, writable=True)
            src_view = _byte_view(src, writable=False)
            _check_len(dst_view, count, "dst")
            _check_len(src_view, count, "src")
            dst_view[:count] = src_view[:count]
            return
        if isinstance(dst, int):
            if kind not in (MemcpyKind.HOST_TO_DEVICE, MemcpyKind.DEFAULT, MemcpyKind.HOST_TO_HOST):
                raise AclError(
                    ACL_ERROR_INVALID_PARAM, f"memcpy kind {kind} does not match a host buffer as src"
                )
            dst_kind = MemcpyKind.HOST_TO_HOST if datalink.is_host_ptr(dst) else MemcpyKind.HOST_TO_DEVICE
            src_view = _byte_view(src, writable=False)
            _check_len(src_view, count, "src")
            self._staged_in(dst, src_view, count, dst_kind)
        else:
            assert isinstance(src, int)
            if kind not in (MemcpyKind.DEVICE_TO_HOST, MemcpyKind.DEFAULT, MemcpyKind.HOST_TO_HOST):
                raise AclError(
                    ACL_ERROR_INVALID_PARAM, f"memcpy kind {kind} does not match a host buffer as dst"
                )
            src_kind = MemcpyKind.HOST_TO_HOST if datalink.is_host_ptr(src) else MemcpyKind.DEVICE_TO_HOST
            dst_view = _byte_view(dst, writable=True)
            _check_len(dst_view, count, "dst")
            self._staged_out(dst_view, src, count, src_kind)

    def copy_to_device(self, ptr: int, data: Any) -> None:
        """Copy a whole host buffer to ``ptr``."""
        view = _byte_view(data, writable=False)
        self.memcpy(ptr, view.nbytes, view, view.nbytes, MemcpyKind.HOST_TO_DEVICE)

    def copy_from_device(self, ptr: int, count: int) -> bytes:
        """Read ``count`` bytes from ``ptr``."""
        out = bytearray(count)
        self.memcpy(out, count, ptr, count, MemcpyKind.DEVICE_TO_HOST)
        return bytes(out)

    def create_stream(self) -> int:
        return self.call(Op.CREATE_STREAM)[0]

    def destroy_stream(self, stream: int) -> None:
        self.call(Op.DESTROY_STREAM, stream)

    def synchronize_stream(self, stream: int) -> None:
        self.call(Op.SYNCHRONIZE_STREAM, stream)

    def synchronize_device(self) -> None:
        self.call(Op.SYNCHRONIZE_DEVICE)

    def launch_kernel(
        self,
        stream: int,
        duration_us: int,
        *,
        tag: int = 0,
        out_ptr: int = 0,
        in_ptr: int = 0,
        in_len: int = 0,
    ) -> None:
        """Queue an emulated kernel: it occupies the die for ``duration_us`` under the share's policy,
        then writes (tag, crc32 of in_len bytes at in_ptr) as two little-endian u64 at ``out_ptr``."""
        self.call(Op.LAUNCH_KERNEL, stream, duration_us, tag, out_ptr, in_ptr, in_len)

    def stats(self) -> tuple[int, int]:
        """(kernels completed, die microseconds used) by this session."""
        kernels, die_us = self.call(Op.GET_STATS)
        return kernels, die_us

    # -- models ------------------------------------------------------------------------------------

    def send_model(self, data: ModelData) -> int:
        """Hand the aclserver a model's bytes (a path, a buffer, or a malloc_host pointer and size);
        return the blob id that ``load_model``, ``query_model_size`` and ``query_model_desc`` take."""
        if isinstance(data, tuple):
            ptr, size = data
            blob = self.call(Op.MODEL_BYTES_OPEN, size)[0]
            try:
                self.call(Op.MODEL_BYTES_WRITE, blob, 0, ptr, size)
            except BaseException:
                self.call(Op.MODEL_BYTES_CLOSE, blob)
                raise
            return blob
        if isinstance(data, str | os.PathLike):
            try:
                with open(data, "rb") as fh:
                    raw = fh.read()
            except OSError as exc:
                raise AclError(
                    ACL_ERROR_READ_MODEL_FAILURE, f"cannot read the model file {data}: {exc}"
                ) from None
            view = memoryview(raw)
        else:
            view = _byte_view(data, writable=False)
        if not view.nbytes:
            raise AclError(ACL_ERROR_INVALID_PARAM, "the model is empty")
        blob = self.call(Op.MODEL_BYTES_OPEN, view.nbytes)[0]
        try:
            self._send_staged(
                view, view.nbytes, lambda done, host, n: (Op.MODEL_BYTES_WRITE, (blob, done, host, n))
            )
        except BaseException:
            with contextlib.suppress(AclError):
                self.call(Op.MODEL_BYTES_CLOSE, blob)
            raise
        return blob

    def load_model(
        self, data: ModelData, *, weight: tuple[int, int] = (0, 0), work: tuple[int, int] = (0, 0)
    ) -> int:
        """aclmdlLoadFrom{File,Mem}[WithMem]: the model id. ``weight``/``work``: the caller's device
        memory (pointer, size); (0, 0): taken from the claim's quota."""
        blob = self.send_model(data)
        try:
            return self.call(Op.MODEL_LOAD, blob, weight[0], weight[1], work[0], work[1])[0]
        except AclError:
            with contextlib.suppress(AclError):
                self.call(Op.MODEL_BYTES_CLOSE, blob)
            raise

    def query_model_size(self, data: ModelData) -> tuple[int, int]:
        """aclmdlQuerySize(FromMem): (work bytes, weight bytes)."""
        blob = self.send_model(data)
        try:
            work, weight = self.call(Op.MODEL_QUERY_SIZE, blob)
            return work, weight
        finally:
            with contextlib.suppress(AclError):
                self.call(Op.MODEL_BYTES_CLOSE, blob)

    def query_model_desc(self, data: ModelData) -> modelfile.ModelFile:
        """aclmdlGetDescFromFile/FromMem: a model's description without loading it."""
        blob = self.send_model(data)
        try:
            return self._desc(self.link.request(Op.MODEL_QUERY_DESC, (blob,)))
        finally:
            with contextlib.suppress(AclError):
                self.call(Op.MODEL_BYTES_CLOSE, blob)

    def model_desc(self, model_id: int) -> modelfile.ModelFile:
        """aclmdlGetDesc: the loaded model's whole description (queries are answered from it)."""
        return self._desc(self.link.request(Op.MODEL_GET_DESC, (model_id,)))

    def execute_model(
        self,
        model_id: int,
        inputs: Sequence[tuple[int, int]],
        outputs: Sequence[tuple[int, int]],
        stream: int = 0,
    ) -> None:
        """aclmdlExecute (``stream`` 0: returns when the outputs are written) or aclmdlExecuteAsync.
        Buffers are (device pointer, size)."""
        tail = b"".join(_PAIR.pack(p, n) for p, n in (*inputs, *outputs))
        self.call(Op.MODEL_EXECUTE, model_id, stream, len(inputs), len(outputs), tail=tail)

    def unload_model(self, model_id: int) -> None:
        self.call(Op.MODEL_UNLOAD, model_id)

    @staticmethod
    def _desc(reply: protocol.Message) -> modelfile.ModelFile:
        if reply.ints[0] != 0:
            raise AclError(reply.ints[0], reply.tail.decode(errors="replace"))
        return modelfile.parse_header(reply.tail)

    # -- staged copies -----------------------------------------------------------------------------

    def _staged_in(self, dst: int, src: memoryview, count: int, kind: MemcpyKind) -> None:
        """A copy to ``dst`` through the staging region (see ``_send_staged``)."""
        self._send_staged(
            src, count,
            lambda done, host, n: (Op.MEMCPY, (dst + done, count - done, host, n, kind, count - done)),
        )  # fmt: skip

    def _send_staged(
        self, src: memoryview, count: int, frame: Callable[[int, int, int], tuple[int, tuple[int, ...]]]
    ) -> None:
        """Send ``count`` bytes of ``src`` through the two halves of the staging region, pipelined:
        the client fills one half while the server drains the other. ``frame(done, host_ptr, n)``
        is the request that hands the server the chunk of ``n`` bytes at offset ``done``."""
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
            self._check(link.receive(pending))

    def _staged_out(self, dst: memoryview, src: int, count: int, kind: MemcpyKind) -> None:
        """Copy out through the two staging halves: the server fills one while the client drains the other."""
        half = self._staging.size // 2
        stage = self._staging.view
        link = self.link
        chunks = [(d, min(half, count - d)) for d in range(0, count, half)] or [(0, 0)]
        with link.lock:
            rid = link.send(Op.MEMCPY, (datalink.host_ptr(0, 0), half, src, chunks[0][1], kind, count))
            for k, (done, n) in enumerate(chunks):
                reply = link.receive(rid)
                if k + 1 < len(chunks):
                    nxt_done, nxt_n = chunks[k + 1]
                    nxt_off = ((k + 1) % 2) * half
                    rid = link.send(
                        Op.MEMCPY,
                        (datalink.host_ptr(0, nxt_off), half, src + nxt_done, nxt_n, kind, count - nxt_done),
                    )
                self._check_or_drain(reply, k + 1 < len(chunks), rid)
                off = (k % 2) * half
                dst[done : done + n] = stage[off : off + n]

    def _check_or_drain(self, reply: protocol.Message, more: bool, next_rid: int) -> None:
        if reply.ints[0] != 0:
            if more:
                self.link.receive(next_rid)
            self._check(reply)

    @staticmethod
    def _check(reply: protocol.Message) -> None:
        if reply.ints[0] != 0:
            raise AclError(reply.ints[0], reply.tail.decode(errors="replace"))


def _byte_view(data: object, *, writable: bool) -> memoryview:
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


def _check_len(view: memoryview, count: int, name: str) -> None:
    if view.nbytes < count:
        raise AclError(
            ACL_ERROR_INVALID_PARAM,
            f"memcpy count {count} exceeds the {name} host buffer ({view.nbytes} bytes)",
        )
