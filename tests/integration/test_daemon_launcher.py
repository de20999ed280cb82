"""The daemon's aclserver launchers: the pre-imported zygote, its restart, and the spawn fallback."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver import wirefiles
from flexnpu_runtime.daemon import claim_files, launch_spec, processes
from flexnpu_runtime.daemon.launcher import SpawnLauncher, ZygoteLauncher
from tests.integration.daemon_harness import gone, ping_unix, request, wait_for


@pytest.fixture
def dirs() -> Iterator[tuple[Path, Path]]:
    run = Path(tempfile.mkdtemp(prefix="fnl-", dir="/tmp"))
    shm = Path(tempfile.mkdtemp(prefix="fnl-", dir="/dev/shm"))
    yield run, shm
    for pid, _ in processes.find_aclservers(run / "aclservers", run_dir=run):
        processes.stop_group(pid, start_time=processes.stat(pid).start_time, timeout=1)  # type: ignore[union-attr]
    shutil.rmtree(run, ignore_errors=True)
    shutil.rmtree(shm, ignore_errors=True)


def _start(launcher: ZygoteLauncher, run: Path, shm: Path, uid: str) -> processes.Launched:
    paths = launch_spec.claim_paths(uid, run_dir=run, shm_root=shm)
    claim_files.prepare_shm_dir(paths, ledger_dir=shm / launch_spec.LEDGER_DIR_NAME)
    wirefiles.write_spec(
        paths.spec, launch_spec.build_spec(request(uid), paths=paths, shm_root=shm, tcp_host="127.0.0.1")
    )
    launched = launcher.launch(spec_path=paths.spec, stderr_path=paths.stderr)
    processes.wait_ready(
        launched, ready_path=paths.ready, stderr_path=paths.stderr, timeout=15, claim_uid=uid
    )
    assert ping_unix(str(paths.unix_socket)) == launched.pid
    return launched


def test_zygote_forks_session_leaders_and_survives_its_own_death(dirs: tuple[Path, Path]) -> None:
    run, shm = dirs
    launcher = ZygoteLauncher(
        run_dir=run, fallback=SpawnLauncher([sys.executable, "-m", "flexnpu_runtime.aclserver"])
    )
    try:
        launcher.start()
        first = _start(launcher, run, shm, "claim-one")
        st = processes.stat(first.pid)
        assert st is not None and st.pgrp == first.pid  # its own process group / session
        assert first.popen is None and first.cmdline == launcher.argv
        # the forked aclserver names itself after its claim (ps / pgrep aclserver)
        title = processes.cmdline(first.pid)
        assert title is not None and title[:4] == (
            "flexnpu-aclserver",
            "claim-one",
            "--spec",
            str(run / "aclservers" / "claim-one.spec.json"),
        )
        assert (Path("/proc") / str(first.pid) / "comm").read_text().strip() == "aclserver-claim"
        assert processes.find_aclservers(run / "aclservers", run_dir=run) == [
            (first.pid, f"spec {run / 'aclservers' / 'claim-one.spec.json'}")
        ]
        zygote_pid = launcher._proc.pid if launcher._proc else 0
        os.kill(zygote_pid, signal.SIGKILL)
        second = _start(launcher, run, shm, "claim-two")  # a new zygote is started on demand
        assert second.popen is None and launcher._proc is not None and launcher._proc.pid != zygote_pid
        assert ping_unix(str(shm / "claim-one" / "aclserver.sock")) == first.pid  # unaffected
    finally:
        launcher.close()
    assert ping_unix(str(shm / "claim-two" / "aclserver.sock")) == second.pid  # outlives the zygote
    assert processes.stop_group(second.pid, start_time=second.start_time, timeout=2)
    wait_for(lambda: gone(second.pid), what="aclserver stopped")


def test_unusable_zygote_falls_back_to_spawn(dirs: tuple[Path, Path]) -> None:
    run, shm = dirs
    launcher = ZygoteLauncher(
        run_dir=run, fallback=SpawnLauncher([sys.executable, "-m", "flexnpu_runtime.aclserver"])
    )
    launcher.argv = (sys.executable, "-c", "import sys; sys.exit(5)")
    try:
        launched = _start(launcher, run, shm, "claim-three")
    finally:
        launcher.close()
    assert launched.popen is not None  # spawned
    assert processes.stop_group(
        launched.pid, start_time=launched.start_time, timeout=2, reap=launched.exit_status
    )
    assert launched.exit_status() == 0  # the aclserver contract: SIGTERM → clean exit 0
