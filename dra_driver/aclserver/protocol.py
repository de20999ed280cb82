"""Old import path (documented alias): the frame format is ``flexnpu_wire.framing`` (ops in ``flexnpu_wire.ops``)."""

from __future__ import annotations

from flexnpu_wire.framing import *  # noqa: F403
