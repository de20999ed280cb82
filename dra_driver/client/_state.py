"""Old import path (documented alias): this module is ``flexnpu_client._state`` (see ``dra_driver/client/__init__.py``)."""

from __future__ import annotations

from flexnpu_client._state import *  # noqa: F403
