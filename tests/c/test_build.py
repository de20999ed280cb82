"""The built library: ``make install`` lays out what the image and the CDI spec expect, the SONAME
is ``libascendcl.so``, every function issue 11 lists is exported, nothing but ACL names is, and it
needs nothing beyond libc."""

from __future__ import annotations

import re
import stat
import subprocess
from pathlib import Path

from dra_driver import interposition
from dra_driver.testing import clibrary

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
    assert preload.read_text() == interposition.CONTAINER_LIBRARY + "\n"
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


def test_exported_symbols(library: Path) -> None:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.split()[1] in ("T", "W")}
    assert set(LISTED) <= exported, sorted(set(LISTED) - exported)
    foreign = sorted(s for s in exported if not s.startswith("acl"))
    assert foreign == [], foreign
    assert len(exported) > 100  # the listed functions, more served ones, and the refusing stubs
