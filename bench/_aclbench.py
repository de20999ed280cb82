"""Shared helpers of the aclserver benchmarks: statistics and a throw-away work directory."""

from __future__ import annotations

import contextlib
import shutil
import statistics
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path


def med(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def p99(xs: Sequence[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(0.99 * (len(s) - 1)))]


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fnpu-bench-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
