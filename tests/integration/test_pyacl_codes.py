"""The pyACL-shaped functions return ACL codes for every failure and never raise (as pyACL does)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from flexnpu_client import acl
from flexnpu_testing import aclserver_harness
from flexnpu_wire import clientconf, codes


@pytest.fixture
def conf_path(tmp_path: Path) -> Iterator[Path]:
    with aclserver_harness.running_aclserver(
        tmp_path,
        shares=[aclserver_harness.share(0, die=11, memory=32 << 20)],
        ledger_dir=str(tmp_path / "ledger"),
    ) as srv:
        path = tmp_path / "client.conf"
        path.write_text(clientconf.render(srv.conf()))
        yield path
        acl.finalize()


BAD_CALLS = [
    pytest.param(lambda: acl.rt.malloc("lots", 0)[1], codes.ACL_ERROR_INVALID_PARAM, id="malloc-str"),
    pytest.param(lambda: acl.rt.malloc(-5, 0)[1], codes.ACL_ERROR_INVALID_PARAM, id="malloc-negative"),
    pytest.param(lambda: acl.rt.malloc(1 << 70, 0)[1], codes.ACL_ERROR_INVALID_PARAM, id="malloc-overflow"),
    pytest.param(
        lambda: acl.rt.malloc(64 << 20, 0)[1], codes.ACL_ERROR_RT_MEMORY_ALLOCATION, id="over-quota"
    ),
    pytest.param(lambda: acl.rt.free(None), codes.ACL_ERROR_INVALID_PARAM, id="free-none"),
    pytest.param(lambda: acl.rt.free(12345), codes.ACL_ERROR_INVALID_PARAM, id="free-unknown"),
    pytest.param(lambda: acl.rt.set_device(99), codes.ACL_ERROR_INVALID_DEVICE, id="no-such-device"),
    pytest.param(
        lambda: acl.rt.memcpy(object(), 1, object(), 1, 1), codes.ACL_ERROR_INVALID_PARAM, id="memcpy-junk"
    ),
    pytest.param(lambda: acl.rt.get_mem_info("hbm")[2], codes.ACL_ERROR_INVALID_PARAM, id="mem-info-str"),
    pytest.param(
        lambda: acl.rt.destroy_stream(7), codes.ACL_ERROR_INVALID_RESOURCE_HANDLE, id="no-such-stream"
    ),
]


@pytest.mark.parametrize(("call", "want"), BAD_CALLS)
def test_bad_calls_return_codes_and_leave_a_message(conf_path: Path, call: object, want: int) -> None:
    assert acl.init(str(conf_path)) == codes.ACL_SUCCESS, acl.get_last_error()
    assert acl.rt.set_device(0) == codes.ACL_SUCCESS
    assert callable(call)
    assert call() == want
    assert acl.get_last_error()
    free, total, ret = acl.rt.get_mem_info(acl.HBM_MEM)  # the session is still usable
    assert (free, total, ret) == (32 << 20, 32 << 20, 0)


def test_calls_before_init_and_after_finalize_are_uninitialised(conf_path: Path) -> None:
    assert acl.rt.malloc(16, 0) == (0, codes.ACL_ERROR_UNINITIALIZE)
    assert acl.init(str(conf_path)) == 0
    assert acl.init(str(conf_path)) == codes.ACL_ERROR_REPEAT_INITIALIZE
    assert acl.finalize() == 0
    assert acl.rt.set_device(0) == codes.ACL_ERROR_UNINITIALIZE
