"""The object API of the client library: one ``Session`` per connection to the claim's aclserver.

Every method raises ``AclError`` for a non-zero ACL code. Host data for memcpy is either a
``malloc_host`` pointer (the buffer lives in shared memory: zero copy) or any buffer object
(bytes, bytearray, memoryview, numpy array), which is copied through the connection's staging
region in chunks (``hostlink.py``). Bulk bytes never travel on the socket.

Usage::

    with Session.open() as s:        # $FLEXNPU_CONF or /etc/flexnpu/client.conf
        s.init(); s.set_device(0)
        ptr = s.malloc(1 << 20)
        s.memcpy(ptr, 1 << 20, b"x" * 1024, 1024, MemcpyKind.HOST_TO_DEVICE)
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from flexnpu_client import transport
from flexnpu_client.errors import AclError, ConfigError, ConnectError
from flexnpu_client.hostlink import HostLink, byte_view, check, check_len
from flexnpu_wire import clientconf, modelfile
from flexnpu_wire import framing as protocol
from flexnpu_wire.clientconf import ClientConf
from flexnpu_wire.codes import ACL_ERROR_INVALID_PARAM, ACL_ERROR_READ_MODEL_FAILURE, MemAttr, MemcpyKind
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


class Session:
    """A connection to the aclserver of one claim (see the module docstring)."""

    def __init__(self, conf: ClientConf, link: transport.SocketTransport) -> None:
        self.conf = conf
        self.link = link
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
        self._host = HostLink(link, conf.shm_dir, (reply.tail.decode(), staging_size))

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
        self._host.close()
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
        return check(self.link.request(op, ints, tail))

    def ping(self) -> int:
        """The aclserver's pid (PING needs no authentication)."""
        return self.link.request(Op.PING).ints[1]

    def init(self) -> None:
        self.call(Op.INIT)

    def finalize(self) -> None:
        self.call(Op.FINALIZE)
        self._host.unmap_host_buffers()

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
        return self._host.malloc_host(size)

    def free_host(self, ptr: int) -> None:
        self._host.free_host(ptr)

    def host_view(self, ptr: int, size: int | None = None) -> memoryview:
        """A writable view of a malloc_host buffer (from ``ptr``, ``size`` bytes or to its end)."""
        return self._host.host_view(ptr, size)

    def memcpy(self, dst: HostData, dst_max: int, src: HostData, count: int, kind: int) -> None:
        """aclrtMemcpy; device sides are ints, host sides a malloc_host pointer or a buffer."""
        kind = MemcpyKind(kind) if kind in MemcpyKind.__members__.values() else kind
        if isinstance(dst, int) and isinstance(src, int):
            self.call(Op.MEMCPY, dst, dst_max, src, count, kind)
            return
        if count < 0 or count > dst_max:
            raise AclError(ACL_ERROR_INVALID_PARAM, f"memcpy count {count} must be in 0..dst_max ({dst_max})")
        if not isinstance(dst, int) and not isinstance(src, int):
            dst_view = byte_view(dst, writable=True)
            src_view = byte_view(src, writable=False)
            check_len(dst_view, count, "dst")
            check_len(src_view, count, "src")
            dst_view[:count] = src_view[:count]
            return
        if isinstance(dst, int):
            self._host.copy_in(dst, src, count, kind)
        else:
            assert isinstance(src, int)
            self._host.copy_out(dst, src, count, kind)

    def copy_to_device(self, ptr: int, data: Any) -> None:
        """Copy a whole host buffer to ``ptr``."""
        view = byte_view(data, writable=False)
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
            view = byte_view(data, writable=False)
        if not view.nbytes:
            raise AclError(ACL_ERROR_INVALID_PARAM, "the model is empty")
        blob = self.call(Op.MODEL_BYTES_OPEN, view.nbytes)[0]
        try:
            self._host.send(
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
        check(reply)
        return modelfile.parse_header(reply.tail)
