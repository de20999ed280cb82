"""The daemon's shm decision (pure): where a claim's tmpfs bound can be kept, and what is said otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexnpu_runtime.daemon import main as daemon_main
from flexnpu_runtime.daemon import shmroot

ROOT = Path("/dev/shm/flexnpu")


@pytest.mark.parametrize(
    ("mode", "may_mount", "runtime_ns", "shared", "mounts", "problem"),
    [
        pytest.param("auto", True, True, False, True, "", id="host-namespace-private-root"),
        pytest.param("auto", True, False, True, True, "", id="own-namespace-shared-root"),
        pytest.param("auto", True, True, True, True, "", id="host-namespace-shared-root"),
        pytest.param("auto", True, False, False, False, "not on a shared mount", id="own-namespace-private"),
        pytest.param("auto", False, True, True, False, "CAP_SYS_ADMIN", id="may-not-mount"),
        pytest.param("never", True, False, False, False, "", id="never-is-the-operators-choice"),
        pytest.param("always", False, False, False, True, "", id="always-is-the-operators-choice"),
    ],
)
def test_the_bound_is_kept_wherever_it_can_be(
    mode: str, may_mount: bool, runtime_ns: bool, shared: bool, mounts: bool, problem: str
) -> None:
    got = shmroot.decide(mode, root=ROOT, may_mount=may_mount, runtime_namespace=runtime_ns, shared=shared)
    assert got.mount is mounts
    assert (problem in got.problem) if problem else got.problem == ""
    if got.problem:  # the sentence says what to do, including the explicit way out
        assert "--shm-mount never" in got.problem


def test_the_daemon_flag_decides_through_shmroot(tmp_path: Path) -> None:
    never = daemon_main.build_config(["--shm-root", str(tmp_path), "--shm-mount", "never"], {})
    assert (never.settings.shm_mount, never.settings.shm_problem) == (False, "")
    env = {"FLEXNPU_DAEMON_SHM_MOUNT": "always"}
    always = daemon_main.build_config(["--shm-root", str(tmp_path)], env)
    assert (always.settings.shm_mount, always.settings.shm_problem) == (True, "")
