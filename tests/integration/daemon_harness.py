"""Moved to ``flexnpu_testing/daemon.py``: harnesses and doubles live in ``flexnpu_testing/``.

Kept so that ``from tests.integration.daemon_harness import ...`` still works.
"""

from flexnpu_testing.daemon import (
    ACLSERVER_MAIN,
    FAKE,
    FAKE_COMMAND,
    GIB,
    INVENTORY,
    REPO,
    DaemonProc,
    default_command,
    gone,
    hello_tcp,
    ping_tcp,
    ping_unix,
    request,
    share,
)
from flexnpu_testing.waiting import wait_for

__all__ = [
    "ACLSERVER_MAIN",
    "FAKE",
    "FAKE_COMMAND",
    "GIB",
    "INVENTORY",
    "REPO",
    "DaemonProc",
    "default_command",
    "gone",
    "hello_tcp",
    "ping_tcp",
    "ping_unix",
    "request",
    "share",
    "wait_for",
]
