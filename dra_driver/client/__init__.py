"""Old import path (documented alias): the container client is ``flexnpu_client`` (``client/``).

``from dra_driver.client import acl`` keeps working inside the driver distribution: every
``dra_driver.client.<module>`` is the very module object ``flexnpu_client.<module>`` (same
process-wide state), registered here. Application images install the ``flexnpu-client``
distribution alone and import ``flexnpu_client`` (see client/README.md).
"""

from __future__ import annotations

import sys

import flexnpu_client
from flexnpu_client import *  # noqa: F403
from flexnpu_client import _state, acl, errors, rt, session, transport

for _mod in (_state, acl, errors, rt, session, transport):
    sys.modules[f"{__name__}.{_mod.__name__.rsplit('.', 1)[1]}"] = _mod
del _mod
_ = flexnpu_client
