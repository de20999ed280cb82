"""Pure: the zygote's command line, and how to recognise an aclserver forked from it.

Kept apart from ``zygote`` (which imports the aclserver) so the daemon can name the zygote
without importing it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

MODULE = "flexnpu_runtime.daemon.zygote"
JOIN_CGROUP_STATUS = 121
"""Exit status of an aclserver that could not join its cgroup (the same for spawned ones)."""


TITLE_ROOM = 192
"""Spare bytes in the zygote's argv: a forked aclserver rewrites its argv area to show
``flexnpu-aclserver <claim uid> --spec <path>`` (``flexnpu_runtime/aclserver/proctitle.py``)."""


def zygote_argv(python: str, run_dir: Path) -> tuple[str, ...]:
    return (python, "-m", MODULE, "--run-dir", str(run_dir), "--title-room", "_" * TITLE_ROOM)


def is_zygote_cmdline(args: Sequence[str], run_dir: Path) -> bool:
    """True if ``args`` is the command line of our zygote (or of an aclserver it forked)."""
    if MODULE not in args or "--run-dir" not in args:
        return False
    i = list(args).index("--run-dir")
    return i + 1 < len(args) and Path(args[i + 1]) == run_dir
