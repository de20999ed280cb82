"""Device memory stays charged until its last use ends (issue 16 item 2), with a real aclserver.

The loop of the report: malloc the whole quota, memset it, queue a long kernel that reads it, free
it. FREE returns at once and the pointer is dead, but the bytes stay charged until the kernel
ends, so ``get_mem_info`` tells the truth, a second malloc of the quota gets 207001, and the
aclserver's RSS never holds more than one quota plus its own overhead. The task queue is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexnpu_client import AclError, Session
from flexnpu_runtime.aclserver import streams
from flexnpu_testing import aclserver_harness
from flexnpu_testing.aclserver_harness import RunningAclServer, wait_for
from flexnpu_wire import clientconf, codes

QUOTA = 128 << 20
KERNEL_US = 3_000_000
"""Long enough that the checks after FREE run while the kernel is still queued, even on a loaded machine."""
OVERHEAD = 48 << 20
"""The aclserver's own RSS beyond the device memory it holds: interpreter, staging region, buffers
of one chunk of a copy (docs/operations.md, Security)."""


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningAclServer]:
    with aclserver_harness.running_aclserver(
        tmp_path,
        shares=[aclserver_harness.share(0, memory=QUOTA, compute=100)],
        ledger_dir=str(tmp_path / "ledger"),
    ) as srv:
        yield srv


def test_free_of_a_buffer_a_queued_kernel_reads_is_charged_until_the_kernel_ends(
    server: RunningAclServer,
) -> None:
    pid = server.proc.pid
    with Session.open(server.conf()) as s:
        s.init()
        s.set_device(0)
        stream = s.create_stream()
        base = rss(pid)
        for rnd in range(4):
            ptr = s.malloc(QUOTA)
            s.memset(ptr, QUOTA, rnd + 1, QUOTA)
            s.launch_kernel(stream, KERNEL_US, tag=rnd, in_ptr=ptr, in_len=QUOTA)
            s.free(ptr)
            assert s.get_mem_info() == (0, QUOTA), "the queued kernel still holds the whole quota"
            with pytest.raises(AclError) as err:
                s.malloc(QUOTA)
            assert err.value.ret == codes.ACL_ERROR_RT_MEMORY_ALLOCATION
            with pytest.raises(AclError) as err:  # the pointer itself is gone at once, as after aclrtFree
                s.memset(ptr, QUOTA, 0, 16)
            assert err.value.ret == codes.ACL_ERROR_INVALID_PARAM
            assert rss(pid) <= base + QUOTA + OVERHEAD, f"round {rnd}: {rss(pid) >> 20} MiB"
            s.synchronize_stream(stream)
            assert s.get_mem_info() == (QUOTA, QUOTA), "the last use ended: the quota is back"
        assert s.stats()[0] == 4
    wait_for(lambda: rss(pid) <= base + OVERHEAD, what="the buffers gone", timeout=10)


def test_a_session_killed_with_a_deferred_free_returns_its_memory(
    server: RunningAclServer, tmp_path: Path
) -> None:
    """A client that freed a buffer its queued kernel reads, then died (SIGKILL): the kernel is
    cancelled, the bytes come back, another session gets the whole quota."""
    conf = tmp_path / "client.conf"
    conf.write_text(clientconf.render(server.conf()))
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            from flexnpu_client import Session
            s = Session.open({str(conf)!r}); s.init(); s.set_device(0)
            p = s.malloc({QUOTA}); st = s.create_stream()
            s.launch_kernel(st, {streams.MAX_KERNEL_US}, in_ptr=p, in_len={QUOTA}); s.free(p)
            print("freed", flush=True)
            import time; time.sleep(3600)
        """)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "freed"
        with Session.open(server.conf()) as s:
            s.init()
            s.set_device(0)
            assert s.get_mem_info() == (0, QUOTA)
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
            wait_for(lambda: s.get_mem_info() == (QUOTA, QUOTA), what="the dead session's deferred free")
            s.free(s.malloc(QUOTA))
    finally:
        child.kill()
        child.wait()


def test_the_queue_of_one_session_is_bounded(server: RunningAclServer) -> None:
    with Session.open(server.conf()) as s:
        s.init()
        s.set_device(0)
        stream = s.create_stream()
        s.launch_kernel(stream, streams.MAX_KERNEL_US)  # the die is busy: everything else waits
        for _ in range(streams.MAX_QUEUED_TASKS - 1):
            s.launch_kernel(stream, 1)
        with pytest.raises(AclError) as err:
            s.launch_kernel(stream, 1)
        assert err.value.ret == codes.ACL_ERROR_RT_RESOURCE_ALLOC_FAIL and "queued" in str(err.value)
        assert s.get_mem_info() == (QUOTA, QUOTA)
