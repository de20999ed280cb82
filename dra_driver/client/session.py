"""Old import path (documented alias): this module is ``flexnpu_client.session`` (see ``dra_driver/client/__init__.py``)."""

from __future__ import annotations

from flexnpu_client.session import *  # noqa: F403
