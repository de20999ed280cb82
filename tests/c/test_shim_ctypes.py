"""A Python program that loads ``libascendcl.so`` with ctypes (as pyACL and framework plugins do)
gets FlexNPU's shim and is held to the claim's quota. On the host the loader finds the library
through LD_LIBRARY_PATH; tests/e2e/test_podman_shim.py runs the same program in a container."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from flexnpu_testing import aclserver_harness
from tests.c.conftest import HERE, MIB, Claim, run


def test_ctypes_cdll_gets_the_shim(library: Path, claim_factory: Callable[..., Claim]) -> None:
    quota = 128 * MIB
    claim = claim_factory([aclserver_harness.share(0, memory=quota)], staging_bytes=1 * MIB)
    res = run(
        Path(sys.executable), str(HERE / "acl_ctypes.py"), str(quota), "1",
        conf=claim.conf, LD_LIBRARY_PATH=str(library.parent),
    ).ok()  # fmt: skip
    assert res.values["device_count"] == "1"
    assert int(res.values["total"]) == quota
    assert res.values["over_quota_code"] == "207001"
    assert "exceeds the memory quota" in res.values["over_quota_msg"]
