"""The pure half of rediscovery (dra_driver/rediscovery.py): what changed, and which dies wait for the daemon."""

from __future__ import annotations

import dataclasses

import pytest

from dra_driver import rediscovery
from dra_driver.devices import Die, DieMode, Inventory
from dra_driver.discovery import emulated


def inventory(modes: dict[int, str]) -> Inventory:
    doc = {"chips": [{"model": "910B4", "card": c, "mode": m} for c, m in sorted(modes.items())]}
    return emulated.parse_inventory(doc, source="test")


def mode_of(die: Die, inv: Inventory) -> DieMode:
    return inv.die_modes.get(die.phy_id, DieMode.BOTH)


@pytest.mark.parametrize(
    ("old", "new", "text"),
    [
        pytest.param({0: "both"}, {0: "both", 1: "soft"}, "dies added [1]", id="added"),
        pytest.param({0: "both", 1: "soft"}, {0: "both"}, "dies removed [1]", id="removed"),
        pytest.param(
            {0: "both", 1: "soft"}, {0: "both", 1: "whole"}, "die 1 mode soft -> whole", id="mode-only"
        ),
        pytest.param({0: "both"}, {0: "both"}, "nothing", id="same"),
    ],
)
def test_describe(old: dict[int, str], new: dict[int, str], text: str) -> None:
    change = rediscovery.describe(inventory(old), inventory(new), mode_of)
    assert change.text() == text
    assert bool(change) == (text != "nothing")


def test_health_changes_are_named() -> None:
    old = inventory({0: "both"})
    new = dataclasses.replace(old, dies=(dataclasses.replace(old.dies[0], health="Unhealthy"),))  # type: ignore[arg-type]
    assert "die 0 health" in rediscovery.describe(old, new, mode_of).text()


@pytest.mark.parametrize(
    ("daemon_dies", "served", "expected"),
    [
        pytest.param({0, 1, 2}, {0}, set(), id="daemon-knows-all"),
        pytest.param({0}, {0}, {2}, id="new-shared-die-unknown-to-daemon"),
        pytest.param(None, {0}, {2}, id="daemon-unreachable-withholds-only-new-shared"),
        pytest.param(None, {0, 2}, set(), id="already-served-stays"),
    ],
)
def test_withheld(daemon_dies: set[int] | None, served: set[int], expected: set[int]) -> None:
    new = inventory({0: "both", 1: "whole", 2: "soft"})  # die 1 is whole: it never needs the daemon
    got = rediscovery.withheld(new, mode_of, daemon_dies=daemon_dies, served_shared=served)
    assert got == expected
