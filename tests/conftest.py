"""Session-wide hooks and fixtures: the ``root``/``podman`` marker rules (``tests/markers.py``), a short temp dir."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import markers


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    markers.check(items)


def pytest_runtest_setup(item: pytest.Item) -> None:
    markers.skip_unless_root(item)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temp dir (unix socket paths must stay under 108 bytes; pytest's tmp_path can be longer)."""
    d = Path(tempfile.mkdtemp(prefix="fx", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)
