"""``python -m dra_driver.aclserver --spec <path>``."""

from __future__ import annotations

import sys

from dra_driver.aclserver.main import main

sys.exit(main())
