"""Compatibility path: the frame format lives in ``client/flexnpu_wire/framing.py`` (ops in ``ops.py``)."""

from __future__ import annotations

from flexnpu_wire.framing import *  # noqa: F403
