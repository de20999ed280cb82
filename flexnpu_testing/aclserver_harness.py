"""Test harness: start a real aclserver process from a spec in a temporary directory.

``running_aclserver(...)`` writes a spec (unique short paths: shm dir under /dev/shm, so the unix
socket path stays short), starts ``python -m flexnpu_runtime.aclserver``, waits for the ready file
with a deadline, yields, then stops it with SIGTERM (SIGKILL after a grace period) and removes
everything it created. ``client_conf`` builds the matching ClientConf (host paths).
"""

from __future__ import annotations

import contextlib
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_driver import wirefiles
from flexnpu_client.session import Session
from flexnpu_runtime.daemon import shmfs
from flexnpu_testing.waiting import wait_for
from flexnpu_wire import launch
from flexnpu_wire.clientconf import ClientConf, Endpoints, ShareInfo
from flexnpu_wire.codes import Policy, Priority
from flexnpu_wire.launch import AclServerSpec, ReadyInfo, ShareSpec

__all__ = [
    "RunningAclServer",
    "ShareSpec",
    "Tenant",
    "client_conf",
    "make_spec",
    "running_aclserver",
    "share",
    "start_aclserver",
    "wait_for",
]


def share(
    virtual_id: int = 0,
    *,
    die: int = 0,
    memory: int = 64 << 20,
    compute: int = 100,
    policy: Policy | str = Policy.FIXED,
    memory_only: bool = False,
    host_memory: int = 0,
    priority: Priority | str = Priority.NORMAL,
) -> ShareSpec:
    return ShareSpec(
        virtual_id, die, memory, compute, Policy(policy), memory_only, host_memory, str(Priority(priority))
    )


def make_spec(
    work_dir: Path,
    *,
    shares: Sequence[ShareSpec],
    ledger_dir: str,
    claim_uid: str | None = None,
    max_frame_bytes: int = 1 << 20,
    staging_bytes: int = 4 << 20,
    auth_timeout_ms: int = launch.DEFAULT_AUTH_TIMEOUT_MS,
    max_sessions: int = launch.DEFAULT_MAX_SESSIONS,
    max_connections: int = launch.DEFAULT_MAX_CONNECTIONS,
    max_shares_per_die: int = launch.DEFAULT_MAX_SHARES_PER_DIE,
    tcp_listen: bool = True,
) -> AclServerSpec:
    """A spec with fresh paths: shm dir /dev/shm/fnpu-t-<hex>, files in ``work_dir``."""
    uid = claim_uid or str(uuid.uuid4())
    shm_dir = f"/dev/shm/fnpu-t-{secrets.token_hex(5)}"
    return AclServerSpec(
        claim_uid=uid,
        token=secrets.token_hex(16),
        shm_dir=shm_dir,
        unix_socket=f"{shm_dir}/aclserver.sock",
        tcp_host="127.0.0.1",
        tcp_port=0,
        ledger_dir=ledger_dir,
        ready_file=str(work_dir / f"{uid}.ready"),
        shares=tuple(shares),
        max_frame_bytes=max_frame_bytes,
        staging_bytes=staging_bytes,
        auth_timeout_ms=auth_timeout_ms,
        max_sessions=max_sessions,
        max_connections=max(max_connections, max_sessions + 1),
        max_shares_per_die=max_shares_per_die,
        tcp_listen=tcp_listen,
    )


def client_conf(spec: AclServerSpec, ready: ReadyInfo, *, unix: bool = True, tcp: bool = True) -> ClientConf:
    return ClientConf(
        claim_uid=spec.claim_uid,
        token=spec.token,
        endpoints=Endpoints(
            unix=spec.unix_socket if unix else None,
            tcp=f"{ready.tcp_host}:{ready.tcp_port}" if tcp and ready.tcp_port else None,
        ),
        shm_dir=spec.shm_dir,
        shares=tuple(
            ShareInfo(s.virtual_id, s.memory_bytes, s.compute_percent, Policy(s.policy), s.memory_only)
            for s in spec.shares
        ),
    )


@dataclass
class RunningAclServer:
    spec: AclServerSpec
    spec_path: Path
    proc: subprocess.Popen[bytes]
    ready: ReadyInfo
    stderr_path: Path

    def conf(self, *, unix: bool = True, tcp: bool = True) -> ClientConf:
        return client_conf(self.spec, self.ready, unix=unix, tcp=tcp)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Send ``sig`` and reap; SIGKILL if it has not exited within ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_aclserver(
    spec: AclServerSpec, work_dir: Path, *, timeout: float = 15.0, nofile_limit: int | None = None
) -> RunningAclServer:
    """Write the spec (0600), start the process and wait for its ready file (RuntimeError if it exits).

    ``nofile_limit`` caps the process's RLIMIT_NOFILE (soft and hard) before it starts.
    """

    def limit() -> None:
        if nofile_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile_limit, nofile_limit))

    spec_path = work_dir / f"{spec.claim_uid}.spec.json"
    spec_path.write_text(launch.render_spec(spec))
    spec_path.chmod(0o600)
    stderr_path = work_dir / f"{spec.claim_uid}.stderr"
    with stderr_path.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flexnpu_runtime.aclserver", "--spec", str(spec_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            preexec_fn=limit if nofile_limit is not None else None,  # noqa: PLW1509 - only setrlimit
        )
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            ready = wirefiles.load_ready(spec.ready_file)
            return RunningAclServer(spec, spec_path, proc, ready, stderr_path)
        if proc.poll() is not None:
            raise RuntimeError(f"aclserver exited with {proc.returncode}: {stderr_path.read_text()}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"aclserver not ready after {timeout}s: {stderr_path.read_text()}")
        time.sleep(0.005)


@contextlib.contextmanager
def running_aclserver(
    work_dir: Path,
    *,
    shares: Sequence[ShareSpec],
    ledger_dir: str,
    nofile_limit: int | None = None,
    shm_mount_bytes: int | None = None,
    **spec_args: object,
) -> Iterator[RunningAclServer]:
    """Start an aclserver for a fresh spec; always stop it and remove its shm dir.

    ``shm_mount_bytes`` makes the shm dir its own tmpfs of that size first, as flexnpu-daemon
    does on a node (needs root).
    """
    spec = make_spec(work_dir, shares=shares, ledger_dir=ledger_dir, **spec_args)  # type: ignore[arg-type]
    if shm_mount_bytes is not None:
        os.makedirs(spec.shm_dir, mode=0o711)
        shmfs.mount(Path(spec.shm_dir), size_bytes=shm_mount_bytes)
    try:
        server = start_aclserver(spec, work_dir, nofile_limit=nofile_limit)
        try:
            yield server
        finally:
            server.stop()
    finally:
        shmfs.unmount_all_under(Path(spec.shm_dir))
        shutil.rmtree(spec.shm_dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spec.ready_file)


class Tenant:
    """A client that keeps one device saturated with kernels and records its die time.

    Kernels of ``kernel_us`` are launched in batches alternating between two streams, so one batch
    is always queued while the other is synchronized. ``samples`` holds (monotonic time, die
    microseconds completed); ``share(t0, t1)`` is the fraction of the die it got in that window.
    """

    def __init__(self, conf: ClientConf, *, device: int = 0, kernel_us: int = 5_000, batch: int = 4) -> None:
        self.conf = conf
        self.device = device
        self.kernel_us = kernel_us
        self.batch = batch
        self.samples: list[tuple[float, int]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="tenant")

    def start(self) -> Tenant:
        self._thread.start()
        if not self._started.wait(15):
            raise TimeoutError("tenant did not start")
        if self.error:
            raise self.error
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def share(self, t0: float, t1: float) -> float:
        def at(t: float) -> tuple[float, int]:
            before = [s for s in self.samples if s[0] <= t]
            return before[-1] if before else (t, 0)

        (_, a_us), (_, b_us) = at(t0), at(t1)
        return (b_us - a_us) / 1e6 / (t1 - t0)

    def _run(self) -> None:
        try:
            with Session.open(self.conf) as session:
                session.init()
                session.set_device(self.device)
                streams = [session.create_stream(), session.create_stream()]
                self.samples.append((time.monotonic(), 0))
                self._started.set()
                done, i = 0, 0
                while not self._stop.is_set():
                    for _ in range(self.batch):
                        session.launch_kernel(streams[i % 2], self.kernel_us)
                    if i:
                        session.synchronize_stream(streams[(i + 1) % 2])
                        done += self.batch * self.kernel_us
                        self.samples.append((time.monotonic(), done))
                    i += 1
        except BaseException as exc:  # reported to the test thread
            self.error = exc
            self._started.set()


def tcp_listeners(pid: int) -> list[int]:
    """The TCP ports process ``pid`` listens on (its sockets in LISTEN state, IPv4 and IPv6)."""
    owned = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            owned.add(os.readlink(fd))
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and f"socket:[{fields[9]}]" in owned:  # 0A: LISTEN
                ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)
