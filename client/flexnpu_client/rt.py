"""``acl.rt``: the runtime functions of the pyACL-shaped API (outputs first, ``ret`` last)."""

from __future__ import annotations

from flexnpu_client import _state
from flexnpu_client.session import HostData

__all__ = [
    "create_stream",
    "destroy_stream",
    "free",
    "free_host",
    "get_device",
    "get_device_count",
    "get_mem_info",
    "launch_kernel",
    "malloc",
    "malloc_host",
    "memcpy",
    "memset",
    "reset_device",
    "set_device",
    "synchronize_device",
    "synchronize_stream",
]


def get_device_count() -> tuple[int, int]:
    return _state.value_and_ret(lambda: _state.current().get_device_count(), 0)


def set_device(device_id: int) -> int:
    return _state.ret_of(lambda: _state.current().set_device(device_id))


def reset_device(device_id: int) -> int:
    return _state.ret_of(lambda: _state.current().reset_device(device_id))


def get_device() -> tuple[int, int]:
    return _state.value_and_ret(lambda: _state.current().get_device(), -1)


def malloc(size: int, policy: int = 0) -> tuple[int, int]:
    return _state.value_and_ret(lambda: _state.current().malloc(size, policy), 0)


def free(ptr: int) -> int:
    return _state.ret_of(lambda: _state.current().free(ptr))


def malloc_host(size: int) -> tuple[int, int]:
    return _state.value_and_ret(lambda: _state.current().malloc_host(size), 0)


def free_host(ptr: int) -> int:
    return _state.ret_of(lambda: _state.current().free_host(ptr))


def memcpy(dst: HostData, dst_max: int, src: HostData, count: int, kind: int) -> int:
    return _state.ret_of(lambda: _state.current().memcpy(dst, dst_max, src, count, kind))


def memset(ptr: int, dst_max: int, value: int, count: int) -> int:
    return _state.ret_of(lambda: _state.current().memset(ptr, dst_max, value, count))


def get_mem_info(attr: int) -> tuple[int, int, int]:
    (free_b, total), ret = _state.value_and_ret(lambda: _state.current().get_mem_info(attr), (0, 0))
    return free_b, total, ret


def create_stream() -> tuple[int, int]:
    return _state.value_and_ret(lambda: _state.current().create_stream(), 0)


def destroy_stream(stream: int) -> int:
    return _state.ret_of(lambda: _state.current().destroy_stream(stream))


def synchronize_stream(stream: int) -> int:
    return _state.ret_of(lambda: _state.current().synchronize_stream(stream))


def synchronize_device() -> int:
    return _state.ret_of(lambda: _state.current().synchronize_device())


def launch_kernel(  # noqa: PLR0917 - positional like pyACL
    stream: int, duration_us: int, tag: int = 0, out_ptr: int = 0, in_ptr: int = 0, in_len: int = 0
) -> int:
    """Queue an emulated kernel (see ``Session.launch_kernel``)."""
    return _state.ret_of(
        lambda: _state.current().launch_kernel(
            stream, duration_us, tag=tag, out_ptr=out_ptr, in_ptr=in_ptr, in_len=in_len
        )
    )
