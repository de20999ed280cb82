"""aclserver process lifecycle: ready file, SIGTERM cleanup, SIGKILL'd reservations, bad specs,
and the one-policy-per-die rule enforced by the ledger across processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flexnpu_client import AclError, ConnectError, Session
from flexnpu_runtime.aclserver import ledger
from flexnpu_testing import aclserver_harness
from flexnpu_wire.codes import Policy


def test_ready_file_and_sigterm_cleanup(tmp_path: Path) -> None:
    ledger_dir = str(tmp_path / "ledger")
    spec = aclserver_harness.make_spec(
        tmp_path, shares=[aclserver_harness.share(0, die=2, compute=40)], ledger_dir=ledger_dir
    )
    srv = aclserver_harness.start_aclserver(spec, tmp_path)
    try:
        assert srv.ready.pid == srv.proc.pid and srv.ready.tcp_port > 0
        assert srv.ready.unix_socket == spec.unix_socket
        assert oct(os.stat(spec.unix_socket).st_mode & 0o777) == "0o666"
        assert [e.pid for e in ledger.read_entries(ledger_dir, 2)] == [srv.proc.pid]
        session = Session.open(srv.conf(unix=False))  # on TCP the data link is region files
        session.init()
        session.set_device(0)
        session.malloc(4096)
        session.malloc_host(4096)
        assert len(os.listdir(spec.shm_dir)) == 3  # socket, staging, host buffer
        unix = Session.open(srv.conf())  # on the unix socket, sealed memfds: no file at all
        unix.init()
        unix.set_device(0)
        unix.malloc_host(4096)
        assert len(os.listdir(spec.shm_dir)) == 3
        assert srv.stop(signal.SIGTERM) == 0
        assert not os.path.exists(spec.unix_socket)
        assert not os.path.exists(spec.ready_file)
        assert os.listdir(spec.shm_dir) == []
        assert ledger.read_entries(ledger_dir, 2) == []
        with pytest.raises(ConnectError):
            session.get_device_count()
        session.close()
    finally:
        srv.stop(signal.SIGKILL)
        for leftover in Path(spec.shm_dir).glob("*"):
            leftover.unlink()
        os.rmdir(spec.shm_dir)


def test_sigkilled_server_releases_its_reservation(tmp_path: Path) -> None:
    ledger_dir = str(tmp_path / "ledger")
    with aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, die=3, compute=70)], ledger_dir=ledger_dir
    ) as first:
        assert [e.quota for e in ledger.read_entries(ledger_dir, 3)] == [70]
        first.proc.send_signal(signal.SIGKILL)
        # not reaped yet: a zombie must already count as gone
        aclserver_harness.wait_for(
            lambda: ledger.read_entries(ledger_dir, 3) == [], what="reservation released"
        )
        first.proc.wait()
        # the die is free for another policy now
        with aclserver_harness.running_aclserver(
            tmp_path, shares=[aclserver_harness.share(0, die=3, policy=Policy.ELASTIC)], ledger_dir=ledger_dir
        ) as second:
            assert [e.pid for e in ledger.read_entries(ledger_dir, 3)] == [second.proc.pid]


@pytest.mark.parametrize(
    ("second", "ok"),
    [
        pytest.param(
            aclserver_harness.share(0, die=4, compute=20, policy=Policy.ELASTIC),
            False,
            id="elastic-after-fixed",
        ),
        pytest.param(
            aclserver_harness.share(0, die=4, compute=20, policy=Policy.BEST_EFFORT),
            False,
            id="best-effort-after-fixed",
        ),
        pytest.param(
            aclserver_harness.share(0, die=4, compute=20, policy=Policy.FIXED), True, id="same-policy"
        ),
        pytest.param(
            aclserver_harness.share(0, die=4, compute=0, policy=Policy.ELASTIC, memory_only=True),
            True,
            id="memory-only-any-policy",
        ),
        pytest.param(
            aclserver_harness.share(0, die=5, compute=20, policy=Policy.ELASTIC), True, id="other-die"
        ),
    ],
)
def test_one_policy_per_die(tmp_path: Path, second: aclserver_harness.ShareSpec, ok: bool) -> None:
    ledger_dir = str(tmp_path / "ledger")
    with aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, die=4, compute=30)], ledger_dir=ledger_dir
    ):
        spec = aclserver_harness.make_spec(tmp_path, shares=[second], ledger_dir=ledger_dir)
        try:
            if ok:
                aclserver_harness.start_aclserver(spec, tmp_path).stop()
            else:
                with pytest.raises(
                    RuntimeError, match=r"exited with 3: .*all shares of a die must use one policy"
                ):
                    aclserver_harness.start_aclserver(spec, tmp_path)
                assert [e.quota for e in ledger.read_entries(ledger_dir, 4)] == [30]
                assert not os.path.exists(spec.ready_file)
        finally:
            if os.path.isdir(spec.shm_dir):
                for leftover in Path(spec.shm_dir).glob("*"):
                    leftover.unlink()
                os.rmdir(spec.shm_dir)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param("{not json", "is not valid JSON", id="not-json"),
        pytest.param('{"version": 1}', "field claim_uid is required", id="missing-field"),
    ],
)
def test_bad_spec_exits_2_naming_the_file(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.spec.json"
    path.write_text(text)
    out = subprocess.run(
        [sys.executable, "-m", "flexnpu_runtime.aclserver", "--spec", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert str(path) in out.stderr and needle in out.stderr


def test_run_and_load_spec_are_importable_for_a_zygote() -> None:
    code = (
        "import sys, flexnpu_runtime.aclserver.main as m; "
        "assert callable(m.run) and callable(m.load_spec); "
        "bad = [n for n in ('grpc', 'kubernetes', 'numpy') if n in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_sigterm_while_a_client_waits_on_long_kernels(tmp_path: Path) -> None:
    ledger_dir = str(tmp_path / "ledger")
    with aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, die=6, compute=1)], ledger_dir=ledger_dir
    ) as srv:
        session = Session.open(srv.conf())
        session.init()
        session.set_device(0)
        stream = session.create_stream()
        for _ in range(10):
            session.launch_kernel(stream, 10_000_000)  # 100 s of die time at 1 %
        import threading

        result: list[BaseException | None] = []

        def sync() -> None:
            try:
                session.synchronize_stream(stream)
                result.append(None)
            except BaseException as exc:
                result.append(exc)

        waiter = threading.Thread(target=sync)
        waiter.start()
        aclserver_harness.wait_for(
            lambda: any(e.waiting or e.kernels for e in ledger.read_entries(ledger_dir, 6)),
            what="kernels running",
        )
        assert srv.stop(signal.SIGTERM, timeout=20) == 0
        waiter.join(20)
        assert result and isinstance(result[0], (ConnectError, AclError)), result
        session.close()
        assert ledger.read_entries(ledger_dir, 6) == []
