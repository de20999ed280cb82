"""The op table of the aclserver control link: one row per operation, as data.

Each row gives the op number, its name, the int64 values a request carries, the values a reply
carries after the return code, and what the tails hold. The server validates arity from this
table; ``python -m flexnpu_wire.emit`` writes it as JSON and as a C header for the C client
(``client/flexnpu_wire/generated/``), and a test proves the checked-in copies match.

Semantics of the fields are those of the ACL runtime call of the same name (reference in
docs/client-conf.md for the endpoints); only PING and HELLO are accepted before
authentication.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

__all__ = ["OPS", "Op", "OpSpec", "spec_of"]


class Op(IntEnum):
    """Operation codes (numbers are the wire contract; never renumber, only add)."""

    NONE = 0
    PING = 1
    HELLO = 2
    INIT = 3
    FINALIZE = 4
    GET_DEVICE_COUNT = 5
    SET_DEVICE = 6
    RESET_DEVICE = 7
    GET_DEVICE = 8
    MALLOC = 10
    FREE = 11
    MEMCPY = 12
    MEMSET = 13
    GET_MEM_INFO = 14
    MALLOC_HOST = 15
    FREE_HOST = 16
    CREATE_STREAM = 20
    DESTROY_STREAM = 21
    SYNCHRONIZE_STREAM = 22
    SYNCHRONIZE_DEVICE = 23
    LAUNCH_KERNEL = 24
    GET_STATS = 30
    GET_USAGE = 31
    MODEL_BYTES_OPEN = 40
    MODEL_BYTES_WRITE = 41
    MODEL_BYTES_CLOSE = 42
    MODEL_QUERY_SIZE = 43
    MODEL_QUERY_DESC = 44
    MODEL_LOAD = 45
    MODEL_GET_DESC = 46
    MODEL_EXECUTE = 47
    MODEL_UNLOAD = 48
    STAGING_FD = 50
    MALLOC_HOST_FD = 51
    OPERATOR = 60
    VMM_RESERVE = 61
    VMM_RELEASE = 62
    VMM_MALLOC_PHYSICAL = 63
    VMM_FREE_PHYSICAL = 64
    VMM_MAP = 65
    VMM_UNMAP = 66
    BINARY_LOAD = 67
    BINARY_GET_FUNCTION = 68
    LAUNCH_FUNCTION = 69
    BINARY_UNLOAD = 70


@dataclass(frozen=True, slots=True)
class OpSpec:
    """One operation: request values, optional trailing request values, reply values and tails."""

    op: Op
    request: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    reply: tuple[str, ...] = ()
    request_tail: str = ""
    reply_tail: str = ""
    pre_auth: bool = False
    summary: str = ""

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def arities(self) -> tuple[int, ...]:
        """Every accepted number of request values."""
        return tuple(range(len(self.request), len(self.request) + len(self.optional) + 1))


OPS: tuple[OpSpec, ...] = (
    OpSpec(Op.NONE, reply_tail="error text", summary="reply-only: a frame the server could not decode"),
    OpSpec(Op.PING, reply=("server_pid",), reply_tail='"PONG"', pre_auth=True, summary="liveness"),
    OpSpec(
        Op.HELLO,
        request=("protocol_version", "client_pid"),
        reply=("server_pid", "device_count", "staging_bytes"),
        request_tail="claim token (ASCII hex)",
        reply_tail="staging region file name in the shm dir",
        pre_auth=True,
        summary="authenticate; opens a session with its own staging region",
    ),
    OpSpec(Op.INIT, summary="aclInit"),
    OpSpec(Op.FINALIZE, summary="aclFinalize: frees this session's memory, streams and host buffers"),
    OpSpec(Op.GET_DEVICE_COUNT, reply=("count",), summary="aclrtGetDeviceCount"),
    OpSpec(Op.SET_DEVICE, request=("device",), summary="aclrtSetDevice"),
    OpSpec(Op.RESET_DEVICE, request=("device",), summary="aclrtResetDevice"),
    OpSpec(Op.GET_DEVICE, reply=("device",), summary="aclrtGetDevice"),
    OpSpec(Op.MALLOC, request=("size", "policy"), reply=("device_ptr",), summary="aclrtMalloc"),
    OpSpec(Op.FREE, request=("device_ptr",), summary="aclrtFree"),
    OpSpec(
        Op.MEMCPY,
        request=("dst", "dst_max", "src", "count", "kind"),
        optional=("span",),
        summary="aclrtMemcpy; host sides are data-link host pointers; span = bytes of the whole staged copy",
    ),
    OpSpec(Op.MEMSET, request=("device_ptr", "dst_max", "value", "count"), summary="aclrtMemset"),
    OpSpec(
        Op.GET_MEM_INFO,
        request=("attr",),
        reply=("free", "total"),
        summary="aclrtGetMemInfo: the claim's quota and what all its sessions leave free",
    ),
    OpSpec(
        Op.MALLOC_HOST,
        request=("size",),
        reply=("host_ptr", "mapped_bytes"),
        reply_tail="region file name in the shm dir",
        summary="aclrtMallocHost: a zero-copy buffer in the data link",
    ),
    OpSpec(Op.FREE_HOST, request=("host_ptr",), summary="aclrtFreeHost"),
    OpSpec(Op.CREATE_STREAM, reply=("stream",), summary="aclrtCreateStream"),
    OpSpec(Op.DESTROY_STREAM, request=("stream",), summary="aclrtDestroyStream"),
    OpSpec(Op.SYNCHRONIZE_STREAM, request=("stream",), summary="aclrtSynchronizeStream"),
    OpSpec(Op.SYNCHRONIZE_DEVICE, summary="aclrtSynchronizeDevice"),
    OpSpec(
        Op.LAUNCH_KERNEL,
        request=("stream", "duration_us", "tag", "out_ptr", "in_ptr", "in_len"),
        reply=("queued",),
        summary="the emulated kernel: holds the die for duration_us, then writes (tag, crc32) at out_ptr",
    ),
    OpSpec(Op.GET_STATS, reply=("kernels_done", "kernel_us_done"), summary="this session's kernel counters"),
    OpSpec(
        Op.GET_USAGE,
        request=("device",),
        reply=("memory_used", "memory_quota", "compute_used_us", "compute_quota_percent", "sessions"),
        summary="usage of one vNPU across every session of the claim (additive, version 1)",
    ),
    OpSpec(
        Op.MODEL_BYTES_OPEN,
        request=("size",),
        reply=("blob",),
        summary="start receiving a model's bytes (charged to the claim's host memory until loaded or closed)",
    ),
    OpSpec(
        Op.MODEL_BYTES_WRITE,
        request=("blob", "offset", "host_ptr", "count"),
        summary="copy count bytes from a data-link host pointer (staging or malloc_host) into the blob at offset",
    ),
    OpSpec(Op.MODEL_BYTES_CLOSE, request=("blob",), summary="drop a blob that was not loaded"),
    OpSpec(
        Op.MODEL_QUERY_SIZE,
        request=("blob",),
        reply=("work_size", "weight_size"),
        summary="aclmdlQuerySize(FromMem): the device memory the model in the blob needs",
    ),
    OpSpec(
        Op.MODEL_QUERY_DESC,
        request=("blob",),
        reply_tail="the model description (docs/model-format.md header layout)",
        summary="aclmdlGetDescFromFile/FromMem: the description of the model in the blob",
    ),
    OpSpec(
        Op.MODEL_LOAD,
        request=("blob", "weight_ptr", "weight_size", "work_ptr", "work_size"),
        reply=("model_id",),
        summary="aclmdlLoadFrom*: load the blob on the current device (pointer 0: memory from the quota); consumes it",
    ),
    OpSpec(
        Op.MODEL_GET_DESC,
        request=("model_id",),
        reply_tail="the model description (docs/model-format.md header layout)",
        summary="aclmdlGetDesc: the whole description once; the client answers every query from it",
    ),
    OpSpec(
        Op.MODEL_EXECUTE,
        request=("model_id", "stream", "n_inputs", "n_outputs"),
        request_tail="(device_ptr, size) int64 big-endian pairs: the inputs, then the outputs",
        summary="aclmdlExecute (stream 0: returns when done) / aclmdlExecuteAsync (queued on the stream)",
    ),
    OpSpec(Op.MODEL_UNLOAD, request=("model_id",), summary="aclmdlUnload: waits for its queued executions"),
    OpSpec(
        Op.STAGING_FD,
        reply=("staging_bytes",),
        reply_tail="(SCM_RIGHTS) the session's new staging region: a sealed memfd",
        summary="unix socket only: the staging region becomes a sealed memfd the server maps",
    ),
    OpSpec(
        Op.MALLOC_HOST_FD,
        request=("size",),
        reply=("host_ptr", "mapped_bytes"),
        reply_tail="(SCM_RIGHTS) the buffer: a sealed memfd",
        summary="unix socket only: aclrtMallocHost as a sealed memfd the server maps (copies at memcpy speed)",
    ),
    OpSpec(
        Op.OPERATOR,
        request=("stream", "n_inputs", "n_outputs", "n_attrs"),
        request_tail="the operator's name, tensors and attributes (flexnpu_wire/opcall.py layout)",
        summary="one operator queued on the stream (aclopCompileAndExecute, aclopExecuteV2, the aclnn launches);"
        " never answered: a failure is the stream's error, returned by its next synchronize",
    ),
    OpSpec(
        Op.VMM_RESERVE,
        request=("device", "size"),
        reply=("address",),
        summary="aclrtReserveMemAddress: a range of device addresses, not charged (what is mapped is)",
    ),
    OpSpec(
        Op.VMM_RELEASE, request=("address",), summary="aclrtReleaseMemAddress (nothing may be mapped in it)"
    ),
    OpSpec(
        Op.VMM_MALLOC_PHYSICAL,
        request=("device", "size"),
        reply=("handle",),
        summary="aclrtMallocPhysical: size bytes charged to the quota, reachable once mapped",
    ),
    OpSpec(Op.VMM_FREE_PHYSICAL, request=("handle",), summary="aclrtFreePhysical (it may not be mapped)"),
    OpSpec(
        Op.VMM_MAP,
        request=("address", "size", "offset", "handle"),
        summary="aclrtMapMem: size bytes of the handle from offset at address, inside one reserved range",
    ),
    OpSpec(Op.VMM_UNMAP, request=("address",), summary="aclrtUnmapMem: the mapping that starts at address"),
    OpSpec(
        Op.BINARY_LOAD,
        request=("blob",),
        reply=("binary",),
        summary="aclrtBinaryLoadFromData / rtDevBinaryRegister: the model-bytes blob loaded as a kernel binary on"
        " the current device (ascend backend; the emulated one answers 200001); consumes it",
    ),
    OpSpec(
        Op.BINARY_GET_FUNCTION,
        request=("binary",),
        reply=("function",),
        request_tail="the kernel's name (ASCII, 1..256 bytes)",
        summary="aclrtBinaryGetFunction / rtFunctionRegister: a kernel of a loaded binary",
    ),
    OpSpec(
        Op.LAUNCH_FUNCTION,
        request=("stream", "function", "block_dim"),
        request_tail="the kernel's arguments, by value (at most 64 KiB)",
        summary="aclrtLaunchKernel / rtKernelLaunch of a binary's function: queued on the stream; a failure is"
        " the stream's error",
    ),
    OpSpec(Op.BINARY_UNLOAD, request=("binary",), summary="aclrtBinaryUnLoad: waits for its queued launches"),
)

_BY_OP = {row.op: row for row in OPS}


def spec_of(op: int) -> OpSpec | None:
    """The row of ``op``, or None for an unknown number."""
    try:
        return _BY_OP[Op(op)]
    except ValueError:
        return None
