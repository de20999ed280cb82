"""The built library: ``make install`` lays out what the image and the CDI spec expect, the SONAME
is ``libascendcl.so``, every function issue 11 lists is exported, nothing but ACL names is, and it
needs nothing beyond libc. The whole surface against its table: tests/c/test_api_table.py."""

from __future__ import annotations

import re
import stat
import subprocess
from pathlib import Path

from dra_driver import interposition
from flexnpu_testing import clibrary
from tests.c.conftest import MIB, Claim, run

LISTED = [
    "aclInit",
    "aclFinalize",
    "aclrtSetDevice",
    "aclrtResetDevice",
    "aclrtGetDevice",
    "aclrtGetDeviceCount",
    "aclrtGetSocName",
    "aclrtGetRunMode",
    "aclrtCreateContext",
    "aclrtDestroyContext",
    "aclrtSetCurrentContext",
    "aclrtGetCurrentContext",
    "aclrtCreateStream",
    "aclrtDestroyStream",
    "aclrtSynchronizeStream",
    "aclrtSynchronizeDevice",
    "aclrtCreateEvent",
    "aclrtRecordEvent",
    "aclrtSynchronizeEvent",
    "aclrtEventElapsedTime",
    "aclrtDestroyEvent",
    "aclrtMalloc",
    "aclrtMallocAlign32",
    "aclrtFree",
    "aclrtMallocHost",
    "aclrtFreeHost",
    "aclrtMemset",
    "aclrtMemcpy",
    "aclrtMemcpyAsync",
    "aclrtGetMemInfo",
    "aclrtLaunchKernel",
    "aclGetRecentErrMsg",
]


def _dynamic(lib: Path) -> str:
    return subprocess.run(
        ["readelf", "-d", "--wide", str(lib)], capture_output=True, text=True, check=True
    ).stdout


def test_install_layout(library: Path, tmp_path: Path) -> None:
    subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(clibrary.LIBRARY_DIR),
            "install",
            f"DESTDIR={tmp_path}",
            "PREFIX=/usr/lib/flexnpu",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    lib = tmp_path / "usr/lib/flexnpu/libascendcl.so"
    preload = tmp_path / "usr/lib/flexnpu/ld.so.preload"
    assert stat.S_IMODE(lib.stat().st_mode) == 0o755 and stat.S_IMODE(preload.stat().st_mode) == 0o644
    assert preload.read_text().split() == [interposition.CONTAINER_LIBRARY] + [
        f"/usr/lib/flexnpu/{n}" for n in interposition.CLOSURE_LIBRARIES
    ]
    for name in (
        interposition.CLOSURE_LIBRARIES
    ):  # the closure is installed beside it (the init container copies *.so)
        assert stat.S_IMODE((lib.parent / name).stat().st_mode) == 0o755, name
    assert lib.read_bytes() == library.read_bytes()


def test_soname_and_dependencies(library: Path) -> None:
    dynamic = _dynamic(library)
    assert "Library soname: [libascendcl.so]" in dynamic
    needed = set(re.findall(r"Shared library: \[([^\]]+)\]", dynamic))
    assert "libc.so.6" in needed and needed <= {
        "libc.so.6",
        "ld-linux-x86-64.so.2",
        "ld-linux-aarch64.so.1",
    }, needed
    assert "BIND_NOW" in dynamic or "FLAGS_1" in dynamic


def test_nothing_but_acl_names_is_exported(library: Path) -> None:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.split()[1] in ("T", "W")}
    assert set(LISTED) <= exported, sorted(set(LISTED) - exported)
    foreign = sorted(s for s in exported if not s.startswith("acl"))
    assert foreign == ["fx_op_launch"], foreign  # FlexNPU's own, for the closure (acl/flexnpu_op.h)


def test_a_cxx_program_builds_against_the_headers_and_runs(
    library: Path, tmp_path: Path, claim: Claim
) -> None:
    """The headers' extern "C" guards and enums work for C++ (warnings are errors), and the
    program is served like a C one."""
    exe = tmp_path / "cxx_app"
    subprocess.run(
        ["c++", "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{clibrary.LIBRARY_DIR / 'include'}",
         str(Path(__file__).with_name("cxx_app.cc")), f"-L{library.parent}", "-lascendcl",
         f"-Wl,-rpath,{library.parent}", "-o", str(exe)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    out = subprocess.run(["nm", "-u", str(exe)], capture_output=True, text=True, check=True).stdout
    assert "aclrtGetMemInfo" in out and "_Z" not in "".join(line for line in out.split() if "acl" in line)
    values = run(exe, conf=claim.conf).ok().values
    assert values == {"count": "1", "total": str(64 * MIB), "over": "207001"}
