"""The process-wide session behind the pyACL-shaped functions (``acl`` and ``acl.rt``).

pyACL semantics: these functions return ACL codes and never raise. ``_call`` maps every
exception to a code and keeps its message for ``acl.get_last_error()``: an ``AclError`` keeps
the server's code; a missing client.conf is 100003 (ACL_ERROR_INVALID_FILE), a malformed one
100006 (ACL_ERROR_PARSE_FILE); a wrong argument type 100000 (ACL_ERROR_INVALID_PARAM); an
unreachable or refusing aclserver, and anything else, 500000 (ACL_ERROR_INTERNAL_ERROR) unless
the refusal carried its own code.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar

from flexnpu_client.errors import AclError, ConfigError, ConnectError
from flexnpu_client.session import Session
from flexnpu_wire.codes import (
    ACL_ERROR_INTERNAL_ERROR,
    ACL_ERROR_INVALID_FILE,
    ACL_ERROR_INVALID_PARAM,
    ACL_ERROR_PARSE_FILE,
    ACL_ERROR_UNINITIALIZE,
)

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
    except ConfigError as exc:
        last_error = exc.message
        return default, ACL_ERROR_INVALID_FILE if exc.unreadable else ACL_ERROR_PARSE_FILE
    except ConnectError as exc:
        last_error = exc.message
        return default, exc.ret or ACL_ERROR_INTERNAL_ERROR
    except (TypeError, ValueError, OverflowError) as exc:
        last_error = f"invalid argument: {exc}"
        return default, ACL_ERROR_INVALID_PARAM
    except Exception as exc:
        last_error = f"{type(exc).__name__}: {exc}"
        return default, ACL_ERROR_INTERNAL_ERROR


def _forget_in_child() -> None:
    """After fork the child must not use the parent's connection: it calls acl.init() again."""
    global session, lock
    session = None
    lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
