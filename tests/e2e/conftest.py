"""E2e fixtures: an isolated podman instance (the real CDI consumer) plus the integration fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexnpu_testing.podman import Podman
from tests.e2e import image
from tests.integration.conftest import api, node_factory  # noqa: F401  (re-exported fixtures)


def podman_unavailable(reason: str) -> None:
    """Fail on CI (podman must run there), skip elsewhere; the message says why and how to fix."""
    message = f"podman cannot run the e2e CDI tests: {reason}"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI is set, so this is a failure; scripts/test.sh installs podman as root)")
    pytest.skip(message)


def _our_mounts(workdir: Path) -> list[str]:
    """Host mounts a podman run could leak: on the CDI dirs, the namespace tmpfses, the work dir."""
    marks = ("/run/cdi", "/etc/cdi", "flexnpu-e2e-run", "flexnpu-e2e-no-cdi", str(workdir))
    return [
        line
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if any(m in line for m in marks)
    ]


@pytest.fixture
def podman() -> Iterator[Podman]:
    """A fresh podman instance; afterwards no container, work dir or host mount is left."""
    reason = Podman.ensure_available()
    if reason is not None:
        podman_unavailable(reason)
    with Podman() as p:
        before = _our_mounts(p.workdir)
        yield p
        assert p.containers() == [], "a container outlived its podman run"
        assert _our_mounts(p.workdir) == before, "a podman run leaked a mount into the host mount namespace"
    assert not p.workdir.exists(), f"{p.workdir} was not removed"


@pytest.fixture(scope="session")
def built_image() -> Iterator[image.Built]:
    """The container image, built once per session by scripts/build-image.sh (tests/e2e/image.py)."""
    yield image.build()
