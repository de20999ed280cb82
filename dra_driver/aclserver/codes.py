"""Old import path (documented alias): the ACL codes and enums are ``flexnpu_wire.codes``."""

from __future__ import annotations

from flexnpu_wire.codes import *  # noqa: F403
