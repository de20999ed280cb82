"""Host memory is host memory (issue 19 item 4): aclrtMallocHost buffers are bounded by the claim's
host-memory limit (``hostMemory``; by default its memory quota), never by its device quota.
A real aclserver; the claim's shm dir is its own tmpfs sized from the limit, as the daemon makes it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flexnpu_client import AclError, Session
from flexnpu_runtime.daemon import shmfs
from flexnpu_testing import aclserver_harness
from flexnpu_wire import codes
from flexnpu_wire.codes import MemcpyKind

GIB = 1 << 30
MIB = 1 << 20


def _tmpfs(host: int) -> int:
    return shmfs.size_for(host_memory_bytes=host, max_sessions=16, staging_bytes=4 * MIB)


def test_a_program_taking_1gib_host_and_1gib_device_memory_runs_on_a_1_5gib_share(tmp_path: Path) -> None:
    quota = GIB + GIB // 2
    with aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, memory=quota)], ledger_dir=str(tmp_path / "l"),
        shm_mount_bytes=_tmpfs(quota),
    ) as server, Session.open(server.conf()) as s:  # fmt: skip
        s.init()
        s.set_device(0)
        host = s.malloc_host(GIB)
        dev = s.malloc(GIB)
        assert s.get_mem_info() == (GIB // 2, quota), "host buffers take nothing of the device quota"
        view = np.frombuffer(s.host_view(host), dtype=np.uint8)
        view[::4096] = 7
        s.memcpy(dev, GIB, host, GIB, MemcpyKind.HOST_TO_DEVICE)
        view[:] = 0
        s.memcpy(host, GIB, dev, GIB, MemcpyKind.DEVICE_TO_HOST)
        assert int(view[::4096].sum()) == 7 * (GIB // 4096)
        s.free(dev)
        s.free_host(host)


@pytest.mark.parametrize(
    ("host_limit", "first", "second", "refused"),
    [
        pytest.param(256 * MIB, 200 * MIB, 100 * MIB, True, id="explicit-limit-below-the-quota"),
        pytest.param(768 * MIB, 300 * MIB, 400 * MIB, False, id="explicit-limit-above-the-quota"),
        pytest.param(0, 100 * MIB, 200 * MIB, True, id="default-is-the-memory-quota"),
    ],
)
def test_host_buffers_are_bounded_by_the_host_limit(
    tmp_path: Path, host_limit: int, first: int, second: int, refused: bool
) -> None:
    quota = 256 * MIB
    with aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, memory=quota, host_memory=host_limit)],
        ledger_dir=str(tmp_path / "l"), shm_mount_bytes=_tmpfs(host_limit or quota),
    ) as server, Session.open(server.conf()) as s, Session.open(server.conf()) as other:  # fmt: skip
        for session in (s, other):
            session.init()
            session.set_device(0)
        s.malloc_host(first)
        if refused:
            with pytest.raises(AclError) as err:
                other.malloc_host(second)  # the limit is the claim's, across its sessions
            assert err.value.ret == codes.ACL_ERROR_RT_MEMORY_ALLOCATION
            assert "hostMemory" in err.value.message and str(host_limit or quota) in err.value.message
        else:
            other.malloc_host(second)
        assert s.get_mem_info() == (quota, quota)
