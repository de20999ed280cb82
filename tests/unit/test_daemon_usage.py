"""Usage per vNPU: the die-time sampler and the session-count file."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexnpu_runtime.daemon import shmfs, usage


@pytest.mark.parametrize(
    ("samples", "want"),
    [
        pytest.param([(0.0, 0)], [-1], id="first-sample-unknown"),
        pytest.param([(0.0, 0), (1.0, 500_000)], [-1, 50], id="half-the-die"),
        pytest.param([(0.0, 0), (2.0, 4_000_000)], [-1, 100], id="capped-at-100"),
        pytest.param([(0.0, 900), (1.0, 100)], [-1, -1], id="counter-reset-unknown"),
        pytest.param([(1.0, 0), (1.0, 10)], [-1, -1], id="no-time-passed"),
    ],
)
def test_sampler_percent_since_the_previous_sample(samples: list[tuple[float, int]], want: list[int]) -> None:
    s = usage.Sampler()
    assert [s.percent(("c", 0), used, now=t) for t, used in samples] == want


def test_sampler_forgets_claims_that_are_gone() -> None:
    s = usage.Sampler()
    s.percent(("a", 0), 0, now=0.0)
    s.percent(("b", 0), 0, now=0.0)
    s.forget([("b", 0)])
    assert s.percent(("a", 0), 10, now=1.0) == -1
    assert s.percent(("b", 0), 10_000, now=1.0) == 1


def test_sessions_file(tmp_path: Path) -> None:
    path = tmp_path / "u.ready.sessions"
    assert usage.sessions(path) == -1
    path.write_text("3\n")
    assert usage.sessions(path) == 3
    path.write_text("x")
    assert usage.sessions(path) == -1
    link = tmp_path / "link.sessions"
    link.symlink_to(path)
    assert usage.sessions(link) == -1  # never followed


def test_tmpfs_size_covers_host_memory_staging_and_slack() -> None:
    assert (
        shmfs.size_for(host_memory_bytes=1 << 30, max_sessions=16, staging_bytes=16 << 20)
        == (1 << 30) + (256 << 20) + shmfs.SLACK_BYTES
    )
