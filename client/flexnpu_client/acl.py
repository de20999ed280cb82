"""pyACL-shaped functions: outputs first, the ACL return code last.

Usage::

    from flexnpu_client import acl
    ret = acl.init()                       # reads $FLEXNPU_CONF (or /etc/flexnpu/client.conf)
    ret = acl.rt.set_device(0)
    ptr, ret = acl.rt.malloc(1 << 20, acl.MEM_MALLOC_HUGE_FIRST)
    free, total, ret = acl.rt.get_mem_info(acl.HBM_MEM)
    model_id, ret = acl.mdl.load_from_file("model.fnm")   # see flexnpu_client/mdl.py
    ret = acl.finalize()
"""

from __future__ import annotations

import os

from flexnpu_client import _state, mdl, rt
from flexnpu_client.mdl import (
    create_data_buffer,
    destroy_data_buffer,
    get_data_buffer_addr,
    get_data_buffer_size_v2,
)
from flexnpu_client.session import Session
from flexnpu_wire.codes import ACL_ERROR_REPEAT_INITIALIZE, MallocPolicy, MemAttr, MemcpyKind

__all__ = [
    "ACL_MEMCPY_DEVICE_TO_DEVICE",
    "ACL_MEMCPY_DEVICE_TO_HOST",
    "ACL_MEMCPY_HOST_TO_DEVICE",
    "ACL_MEMCPY_HOST_TO_HOST",
    "DDR_MEM",
    "HBM_MEM",
    "MEM_MALLOC_HUGE_FIRST",
    "MEM_MALLOC_NORMAL_ONLY",
    "create_data_buffer",
    "destroy_data_buffer",
    "finalize",
    "get_data_buffer_addr",
    "get_data_buffer_size_v2",
    "get_last_error",
    "init",
    "mdl",
    "rt",
]

ACL_MEMCPY_HOST_TO_HOST = int(MemcpyKind.HOST_TO_HOST)
ACL_MEMCPY_HOST_TO_DEVICE = int(MemcpyKind.HOST_TO_DEVICE)
ACL_MEMCPY_DEVICE_TO_HOST = int(MemcpyKind.DEVICE_TO_HOST)
ACL_MEMCPY_DEVICE_TO_DEVICE = int(MemcpyKind.DEVICE_TO_DEVICE)
MEM_MALLOC_HUGE_FIRST = int(MallocPolicy.HUGE_FIRST)
MEM_MALLOC_NORMAL_ONLY = int(MallocPolicy.NORMAL_ONLY)
DDR_MEM = int(MemAttr.DDR_MEM)
HBM_MEM = int(MemAttr.HBM_MEM)


def init(config_path: str | os.PathLike[str] | None = None) -> int:
    """Connect to the claim's aclserver (client.conf from ``config_path`` or $FLEXNPU_CONF) and aclInit."""
    with _state.lock:
        if _state.session is not None:
            return ACL_ERROR_REPEAT_INITIALIZE

        def connect() -> Session:
            session = Session.open(config_path)
            try:
                session.init()
            except BaseException:
                session.close()
                raise
            return session

        session, ret = _state.value_and_ret(connect, None)
        _state.session = session
        return ret


def finalize() -> int:
    """aclFinalize: release everything on the server and close the connection."""
    with _state.lock:
        ret = _state.ret_of(lambda: _state.current().finalize())
        if _state.session is not None:
            _state.session.close()
            _state.session = None
        return ret


def get_last_error() -> str:
    """The message of the last failed call (the server's explanation)."""
    return _state.last_error
