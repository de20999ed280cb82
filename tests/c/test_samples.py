"""Programs of our own in the style of the vendor's samples (tests/c/samples/), compiled as C++17
against libascendcl's headers with warnings as errors and run unmodified against real aclservers:
hello world, memory management, a runtime-only program that includes acl/ops/acl_dvpp.h, and the
data buffers / datasets / tensor descriptors a model program builds (host-side: they keep working
while the aclserver is stopped)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from flexnpu_testing import clibrary
from tests.c.conftest import HERE, MIB, Claim, Interactive, run

SAMPLES = HERE / "samples"


def _sample(name: str, library: Path, *flags: str) -> Path:
    return clibrary.compile_program(SAMPLES / name, link_library=library, extra_flags=flags)


def test_hello_world(library: Path, claim: Claim) -> None:
    res = run(_sample("hello_world.cpp", library), conf=claim.conf).ok()
    steps = [line for line in res.stdout.splitlines() if line.startswith("[INFO]")]
    assert steps[0] == "[INFO] acl init success" and steps[-1] == "[INFO] acl finalize success", res.stdout
    assert "[INFO] run mode host, soc FlexNPU-vNPU" in steps


@pytest.mark.parametrize("size", [pytest.param(4096, id="4k"), pytest.param(9 * MIB + 17, id="9m-odd")])
def test_memory_management(library: Path, claim: Claim, size: int) -> None:
    res = run(_sample("memory_management.cpp", library), str(size), conf=claim.conf).ok()
    assert "[INFO] an allocation beyond the device: 207001" in res.stdout
    assert "[INFO] 0 failed" in res.stdout


def test_a_runtime_program_including_the_dvpp_header(library: Path, claim: Claim) -> None:
    exe = _sample("runtime_with_dvpp_header.cpp", library, "-DENABLE_DVPP_INTERFACE")
    res = run(exe, conf=claim.conf).ok()
    assert "[INFO] devices 1, pixel format enum YUV420SP = 1, copy ok" in res.stdout


def test_tensors_and_datasets(library: Path, claim: Claim) -> None:
    res = run(_sample("tensor_dataset.cpp", library), conf=claim.conf).ok()
    assert "[INFO] the output values" in res.stdout and "[INFO] 0 failed" in res.stdout


def test_host_objects_need_no_aclserver(
    library: Path, claim: Claim, interactive: Callable[..., Interactive]
) -> None:
    prog = interactive(_sample("tensor_dataset.cpp", library), "pause", conf=claim.conf)
    prog.read_until("paused")
    pid = claim.server.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        prog.send("\n")
        lines = prog.read_until("built", timeout=60)
        assert "[INFO] 20,000 host objects built and destroyed" in lines
    finally:
        os.kill(pid, signal.SIGCONT)
    prog.send("\n")
    res = prog.finish(timeout=60)
    assert res.rc == 0 and "[INFO] 0 failed" in res.stdout, res.stdout + res.stderr
