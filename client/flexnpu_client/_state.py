"""The process-wide session behind the pyACL-shaped functions (``acl`` and ``acl.rt``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from flexnpu_client.errors import AclError, ClientError
from flexnpu_client.session import Session
from flexnpu_wire.codes import ACL_ERROR_INTERNAL_ERROR, ACL_ERROR_UNINITIALIZE

T = TypeVar("T")

lock = threading.Lock()
session: Session | None = None
last_error = ""


def current() -> Session:
    if session is None:
        raise AclError(ACL_ERROR_UNINITIALIZE, "acl.init has not been called")
    return session


def ret_of(fn: Callable[[], object]) -> int:
    """Run ``fn`` and return its ACL code (0, or the code of the AclError it raised)."""
    return _call(fn, None)[1]


def value_and_ret(fn: Callable[[], T], default: T) -> tuple[T, int]:
    return _call(fn, default)


def _call(fn: Callable[[], T], default: T) -> tuple[T, int]:
    global last_error
    try:
        return fn(), 0
    except AclError as exc:
        last_error = exc.message
        return default, exc.ret
    except ClientError as exc:
        last_error = str(exc)
        return default, ACL_ERROR_INTERNAL_ERROR
