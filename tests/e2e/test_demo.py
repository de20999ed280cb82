"""The README's first quick-start command: the demo walks claims through their lifecycle and leaves nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from flexnpu_testing import REPO, pythonpath_env


def _ours() -> set[str]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    return {line.split(None, 1)[0] for line in out.splitlines() if "flexnpu-demo-" in line}


def test_demo_runs_every_step_and_leaves_nothing_behind() -> None:
    before_tmp = set(Path("/tmp").glob("flexnpu-demo-*")) | set(Path("/dev/shm").glob("flexnpu-demo-*"))
    proc = subprocess.run(
        [sys.executable, "-m", "flexnpu_testing.demo"],
        cwd=REPO,
        env=pythonpath_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout
    for expected in (
        "kubelet registered npu.flexnpu.io",
        "one CDI spec written",
        "malloc 512 MiB more refused: ACL error 207001",
        "aclInit resolves to FlexNPU's libascendcl.so",
        "aclrtMalloc beyond the quota returns 207001",
        "claim status cleared",
        "registration and DRA sockets removed",
        "nothing left behind",
    ):
        assert expected in out, f"missing {expected!r} in demo output"
    after_tmp = set(Path("/tmp").glob("flexnpu-demo-*")) | set(Path("/dev/shm").glob("flexnpu-demo-*"))
    assert after_tmp <= before_tmp
    assert not _ours()
