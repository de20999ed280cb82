"""The emulated device root, for tests: the production code is ``dra_driver/devroot.py``.

Kept so that ``from flexnpu_testing.devroot import build_device_root`` and
``python3 -m flexnpu_testing.devroot INVENTORY_FILE DEVICE_ROOT`` keep working.
"""

from __future__ import annotations

import sys

from dra_driver.devroot import NULL_DEVICE, build_device_root, device_paths, main

__all__ = ["NULL_DEVICE", "build_device_root", "device_paths", "main"]

if __name__ == "__main__":
    sys.exit(main())
