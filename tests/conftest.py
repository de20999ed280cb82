"""Session-wide hooks: the ``root``/``podman`` marker rules (``tests/markers.py``)."""

from __future__ import annotations

import pytest

from tests import markers


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    markers.check(items)


def pytest_runtest_setup(item: pytest.Item) -> None:
    markers.skip_unless_root(item)
