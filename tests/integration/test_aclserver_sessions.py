"""Several sessions per claim: one quota shared by all, per-session release, the session limit.

A real aclserver process; clients are sessions in this process and real client processes
(killed with SIGKILL to prove their memory comes back when the socket closes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexnpu_client import AclError, ConnectError, Session
from flexnpu_testing import aclserver_harness
from flexnpu_testing.aclserver_harness import RunningAclServer
from flexnpu_testing.waiting import wait_for
from flexnpu_wire import clientconf, codes
from flexnpu_wire.framing import Op

MEM = 64 << 20
MAX_SESSIONS = 4


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningAclServer]:
    with aclserver_harness.running_aclserver(
        tmp_path,
        shares=[aclserver_harness.share(0, die=7, memory=MEM, compute=40)],
        ledger_dir=str(tmp_path / "ledger"),
        max_sessions=MAX_SESSIONS,
        staging_bytes=1 << 20,
    ) as srv:
        yield srv


def _open(server: RunningAclServer) -> Session:
    s = Session.open(server.conf())
    s.init()
    s.set_device(0)
    return s


def test_sessions_share_one_quota_and_mem_info_shows_the_claim(server: RunningAclServer) -> None:
    a, b = _open(server), _open(server)
    try:
        pa = a.malloc(24 << 20)
        b.malloc(24 << 20)
        for s in (a, b):
            free, total = s.get_mem_info()
            assert (free, total) == (MEM - (48 << 20), MEM)
        with pytest.raises(AclError) as err:
            b.malloc(24 << 20)  # 72 MiB > 64 MiB: the claim's quota, not the session's
        assert err.value.ret == codes.ACL_ERROR_RT_MEMORY_ALLOCATION
        with pytest.raises(AclError):
            b.free(pa)  # another session's pointer is not b's to free
        used, quota, _compute_us, compute_quota, sessions = b.call(Op.GET_USAGE, 0)
        assert (used, quota, compute_quota, sessions) == (48 << 20, MEM, 40, 2)
    finally:
        a.close()
    # a's memory is released when its connection ends; b keeps its own
    wait_for(lambda: b.get_mem_info() == (MEM - (24 << 20), MEM), timeout=10, what="a's memory released")
    b.close()


def test_session_limit_refuses_the_next_one_and_frees_a_slot_on_close(server: RunningAclServer) -> None:
    sessions = [_open(server) for _ in range(MAX_SESSIONS)]
    try:
        with pytest.raises(ConnectError, match="max_sessions 4") as err:
            Session.open(server.conf())
        assert err.value.ret == codes.ACL_ERROR_RT_RESOURCE_ALLOC_FAIL
        sessions.pop().close()

        def reopened() -> Session | None:
            try:
                return Session.open(server.conf())
            except ConnectError:
                return None

        sessions.append(wait_for(reopened, timeout=10, what="a session slot freed"))
    finally:
        for s in sessions:
            s.close()


def test_threads_in_their_own_sessions_run_concurrently(server: RunningAclServer) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(MAX_SESSIONS)

    def worker() -> None:
        try:
            with Session.open(server.conf()) as s:
                s.init()
                s.set_device(0)
                start.wait(timeout=30)
                for _ in range(200):
                    ptr = s.malloc(4096)
                    s.copy_to_device(ptr, b"x" * 4096)
                    assert s.copy_from_device(ptr, 4096) == b"x" * 4096
                    s.free(ptr)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(MAX_SESSIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    with _open(server) as s:
        assert s.get_mem_info() == (MEM, MEM)


def test_sigkilled_client_process_returns_its_memory(server: RunningAclServer, tmp_path: Path) -> None:
    conf_path = tmp_path / "client.conf"
    conf_path.write_text(clientconf.render(server.conf()))
    child = textwrap.dedent(
        """
        import sys, time
        from flexnpu_client import acl
        assert acl.init(sys.argv[1]) == 0, acl.get_last_error()
        assert acl.rt.set_device(0) == 0
        ptr, ret = acl.rt.malloc(40 << 20, 0)
        assert ret == 0, acl.get_last_error()
        ptr, ret = acl.rt.malloc_host(1 << 20)
        assert ret == 0, acl.get_last_error()
        print("allocated", flush=True)
        time.sleep(600)
        """
    )
    observer = _open(server)
    procs = [
        subprocess.Popen([sys.executable, "-c", child, str(conf_path)], stdout=subprocess.PIPE, text=True)
        for _ in range(1)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "allocated"
        assert observer.get_mem_info() == (MEM - (40 << 20), MEM)
        with pytest.raises(AclError) as err:
            observer.malloc(32 << 20)  # what the killed process holds is not free yet
        assert err.value.ret == codes.ACL_ERROR_RT_MEMORY_ALLOCATION
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        wait_for(
            lambda: observer.get_mem_info() == (MEM, MEM), timeout=10, what="memory of the killed client"
        )
        ptr = observer.malloc(60 << 20)  # the whole quota is usable again
        observer.free(ptr)
        wait_for(
            lambda: not [f for f in os.listdir(server.spec.shm_dir) if f.startswith("host-")],
            timeout=10,
            what="the killed client's host buffer files removed",
        )
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        observer.close()


def test_threads_sharing_one_session_are_not_held_up_by_a_synchronize(server: RunningAclServer) -> None:
    s = _open(server)
    try:
        stream = s.create_stream()
        s.launch_kernel(stream, 3_000_000)  # the die is busy for 3 s of this 40 % share (≈ 7.5 s)
        synced = threading.Event()

        def sync() -> None:
            s.synchronize_stream(stream)
            synced.set()

        waiter = threading.Thread(target=sync)
        waiter.start()
        results: list[tuple[int, int]] = []
        errors: list[BaseException] = []

        def small_calls() -> None:
            try:
                for _ in range(50):
                    results.append(s.get_mem_info())
                    ptr = s.malloc(4096)
                    s.free(ptr)
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=small_calls) for _ in range(8)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(timeout=60)
        # 800 calls from 8 threads on the same session completed while the synchronize still waits
        assert not errors, errors
        assert len(results) == 400 and all(r[1] == MEM and MEM - 8 * 4096 <= r[0] <= MEM for r in results)
        assert not synced.is_set()
        waiter.join(timeout=60)
        assert synced.is_set()
    finally:
        s.close()
