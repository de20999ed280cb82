"""``python -m flexnpu_runtime.aclserver --spec <path>``."""

from __future__ import annotations

import sys

from flexnpu_runtime.aclserver.main import main

sys.exit(main())
