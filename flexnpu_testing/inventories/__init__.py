"""Ready-made emulated inventory files (see docs/inventory.md), shipped as package data.

``inventories.path("two-chip-910b3.yaml")`` gives the file; ``inventories.NAMES`` lists them.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DEMO", "DIR", "NAMES", "path"]

DIR = Path(__file__).resolve().parent
#: The demo node used by the examples and end-to-end tests: two 910B3 chips.
DEMO = "two-chip-910b3.yaml"
NAMES: tuple[str, ...] = (
    "a3-one-module.yaml",
    "eight-910b4.yaml",
    "mixed-310p3.yaml",
    "two-chip-910b3.yaml",
)


def path(name: str) -> Path:
    """The path of a shipped inventory file; KeyError for an unknown name."""
    if name not in NAMES:
        raise KeyError(f"no shipped inventory {name!r} (have: {', '.join(NAMES)})")
    return DIR / name
