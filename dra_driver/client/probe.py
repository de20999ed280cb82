"""Old import path (documented alias): ``python -m dra_driver.client.probe`` is ``python -m flexnpu_client.probe``."""

from __future__ import annotations

import sys

from flexnpu_client.probe import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
