"""An aclserver's captured stderr is retired for the operator, never deleted, and pruning is safe in parallel."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from flexnpu_runtime.daemon import claim_files, launch_spec


def test_remove_claim_files_retires_the_stderr(tmp_path: Path) -> None:
    paths = launch_spec.claim_paths("u1", run_dir=tmp_path / "run", shm_root=tmp_path / "shm")
    paths.stderr.parent.mkdir(parents=True)
    paths.stderr.write_text("Traceback: the reason it died\n")
    paths.spec.write_text("{}")
    claim_files.remove_claim_files(paths)
    assert not paths.stderr.exists() and not paths.spec.exists()
    [kept] = (paths.stderr.parent / claim_files.RETIRED_DIR).iterdir()
    assert kept.name.startswith("u1.") and kept.name.endswith(".stderr.log")
    assert kept.read_text() == "Traceback: the reason it died\n"


def test_a_symlink_in_place_of_the_stderr_is_removed_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("not ours")
    link = tmp_path / "u2.stderr.log"
    link.symlink_to(target)
    assert claim_files.retire_stderr(link) is None
    assert not link.is_symlink() and target.read_text() == "not ours"


def test_concurrent_retires_keep_the_newest_and_never_fail(tmp_path: Path) -> None:
    """Unprepares of many claims run side by side, each retiring a stderr and pruning the rest."""
    names = [f"c{i:02d}.stderr.log" for i in range(40)]
    for i, name in enumerate(names):
        (tmp_path / name).write_text(name)
        os.utime(tmp_path / name, (1000 + i, 1000 + i))
    errors: list[BaseException] = []
    start = threading.Barrier(len(names))

    def retire(name: str) -> None:
        start.wait()
        try:
            claim_files.retire_stderr(tmp_path / name, keep=5)
        except BaseException as exc:  # recorded for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=retire, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    kept = sorted(p.read_text() for p in (tmp_path / claim_files.RETIRED_DIR).iterdir())
    assert len(kept) == 5 and kept == names[-5:]
