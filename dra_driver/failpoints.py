"""Failpoints: crash the process at a named step, for the fault-injection tests.

Off and free in production: the set of armed points is read once, at import, from
``FLEXNPU_FAILPOINTS`` (a comma-separated list of point names); when it is empty,
:func:`hit` returns at once. An armed point kills the process with SIGKILL when reached —
exactly what a node losing power or an OOM kill does mid-step, with no cleanup handlers.

Points (see :data:`POINTS`) are placed after each recorded step of prepare and unprepare.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "prepare-after-intent",  # PrepareStarted recorded, nothing made yet
    "prepare-after-register",  # the daemon started the aclserver
    "prepare-after-client-conf",  # client.conf written
    "prepare-after-cdi",  # CDI spec written, PrepareCompleted not yet recorded
    "prepare-after-complete",  # PrepareCompleted recorded, claim status not yet written
    "unprepare-after-intent",  # UnprepareStarted recorded
    "unprepare-after-claim-status",
    "unprepare-after-cdi-spec",
    "unprepare-after-client-conf",
    "unprepare-after-daemon-registration",
)

HARD_POINTS = (
    "prepare-after-hard-vnpu",  # a hard-split vNPU made (dra_driver/vnpu), nothing else yet
    "unprepare-after-hard-vnpu",  # a hard-split vNPU destroyed
)
"""Points only a claim with a hard-split vNPU reaches (tests/integration/test_node_hard_split.py)."""

_ARMED = frozenset(p.strip() for p in os.environ.get("FLEXNPU_FAILPOINTS", "").split(",") if p.strip())
_unknown = _ARMED - set(POINTS) - set(HARD_POINTS)
if _unknown:
    raise SystemExit(f"FLEXNPU_FAILPOINTS names unknown failpoints: {', '.join(sorted(_unknown))}")


def hit(point: str) -> None:
    """Die here (SIGKILL) if ``point`` is armed."""
    if _ARMED and point in _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
