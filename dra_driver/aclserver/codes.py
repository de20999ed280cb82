"""Compatibility path: the ACL codes and enums live in ``client/flexnpu_wire/codes.py``."""

from __future__ import annotations

from flexnpu_wire.codes import *  # noqa: F403
