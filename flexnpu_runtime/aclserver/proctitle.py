"""The aclserver's process title: what ``ps`` and ``pgrep aclserver`` show.

A process forked from the daemon's zygote keeps the zygote's command line unless it rewrites
it (``flexnpu_runtime/daemon/zygote.py``), and no CAP_SYS_RESOURCE is needed for the way used here:
the process overwrites its own argv area (``/proc/self/stat`` fields ``arg_start``/``arg_end``)
through ``/proc/self/mem``, which Linux allows for one's own memory, and sets its ``comm``
(15 bytes, what ``pgrep`` matches by default) with ``prctl(PR_SET_NAME)``. The zygote is started
with spare room in its argv (``flexnpu_runtime/daemon/zygote_marker.py``) so the title fits.

``prctl`` is the aclserver's one way to call prctl(2) (also for the timer slack of the threads
that hold the die, ``streams.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from collections.abc import Sequence

__all__ = ["comm_name", "prctl", "set_title"]

_PR_SET_NAME = 15
_COMM_BYTES = 15


def comm_name(claim_uid: str) -> str:
    """The 15-byte ``comm`` of a claim's aclserver: ``aclserver-`` and the UID's first characters."""
    return f"aclserver-{claim_uid}"[:_COMM_BYTES]


def set_title(args: Sequence[str], *, comm: str) -> bool:
    """Make ``/proc/self/cmdline`` read ``args`` (if they fit the argv area) and set ``comm``.

    Returns whether the command line was rewritten (``comm`` is set either way when possible).
    """
    _set_comm(comm)
    data = b"\0".join(a.encode() for a in args) + b"\0"
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        # fields[0] is field 3 (state); arg_start and arg_end are fields 48 and 49
        arg_start, arg_end = int(fields[45]), int(fields[46])
    except (OSError, IndexError, ValueError):
        return False
    room = arg_end - arg_start
    if room <= 0 or len(data) > room:
        return False
    try:
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(arg_start)
            mem.write(data + b"\0" * (room - len(data)))
    except OSError:
        return False
    return True


def prctl(option: int, arg: int | bytes) -> bool:
    """prctl(2) with one argument (an integer or a C string); False when it failed or libc has none."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        if not _LIBC:
            _LIBC.append(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True))
        value = ctypes.c_char_p(arg) if isinstance(arg, bytes) else ctypes.c_ulong(arg)
        return int(_LIBC[0].prctl(option, value, 0, 0, 0)) == 0
    return False


_LIBC: list[ctypes.CDLL] = []


def _set_comm(name: str) -> None:
    prctl(_PR_SET_NAME, name.encode()[:_COMM_BYTES])
