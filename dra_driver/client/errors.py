"""Old import path (documented alias): this module is ``flexnpu_client.errors`` (see ``dra_driver/client/__init__.py``)."""

from __future__ import annotations

from flexnpu_client.errors import *  # noqa: F403
