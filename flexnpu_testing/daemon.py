"""Harness for flexnpu-daemon: a real daemon process on short unix socket paths (tests and benches).

Uses the real aclserver (``python -m flexnpu_runtime.aclserver``) once ``flexnpu_runtime/aclserver/main.py``
exists, else the contract double ``fake_aclserver.py``. Every process and path it creates is
removed by :meth:`DaemonProc.cleanup`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import TypeVar

from dra_driver.daemon_api.client import DaemonClient
from dra_driver.daemon_api.values import RegisterRequest
from flexnpu_runtime.daemon import cgroup_layout, cgroups, processes, shmfs
from flexnpu_testing import inventories
from flexnpu_testing.waiting import wait_for
from flexnpu_wire import framing as protocol
from flexnpu_wire.shares import Share

REPO = Path(__file__).resolve().parents[1]  # flexnpu_testing/daemon.py
ACLSERVER_MAIN = REPO / "flexnpu_runtime" / "aclserver" / "main.py"
FAKE = Path(__file__).with_name("fake_aclserver.py")
FAKE_COMMAND = f"{sys.executable} {FAKE}"
INVENTORY = inventories.path("eight-910b4.yaml")  # dies 0..7, 32 GiB each
GIB = 1024**3
CGROUP_ROOT = Path("/sys/fs/cgroup")
"""The host's cgroup file system, where a root daemon makes its aclservers' cgroups (a non-root one makes none)."""

T = TypeVar("T")


def default_command() -> str | None:
    """None: the daemon's own default (the real aclserver, forked from its zygote)."""
    return None if ACLSERVER_MAIN.exists() else FAKE_COMMAND


def _ping(family: int, address: str | tuple[str, int], timeout: float) -> int:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(address)
        s.sendall(protocol.encode(protocol.Op.PING, 7))
        msg = protocol.FrameReader(s, 1 << 20).read()
    assert msg is not None and msg.op == protocol.Op.PING and msg.request_id == 7, msg
    assert msg.ints[0] == 0, msg
    return int(msg.ints[1]) if len(msg.ints) > 1 else -1


def ping_unix(path: str, timeout: float = 5.0) -> int:
    """PING over the unix socket; the PONG's pid."""
    return _ping(socket.AF_UNIX, path, timeout)


def ping_tcp(host: str, port: int, timeout: float = 5.0) -> int:
    """PING over TCP; the PONG's pid, which is 0 from a real aclserver: before HELLO it tells a
    TCP peer nothing about its process (``hello_tcp`` does)."""
    return _ping(socket.AF_INET, (host, port), timeout)


def hello_tcp(host: str, port: int, token: str, timeout: float = 5.0) -> int:
    """Authenticate over TCP with the claim's token and leave; the aclserver's pid from the reply."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect((host, port))
        s.sendall(
            protocol.encode(protocol.Op.HELLO, 8, (protocol.PROTOCOL_VERSION, os.getpid()), token.encode())
        )
        msg = protocol.FrameReader(s, 1 << 20).read()
    assert msg is not None and msg.op == protocol.Op.HELLO and msg.request_id == 8, msg
    assert msg.ints[0] == 0, msg
    return int(msg.ints[1])


def share(
    die: int = 2, *, vid: int = 0, mem_gib: float = 1, compute: int = 30, policy: str = "fixed"
) -> Share:
    return Share(
        virtual_id=vid,
        die_phy_id=die,
        memory_bytes=int(mem_gib * GIB),
        compute_percent=compute,
        policy=policy,
    )


def request(uid: str, *shares: Share, token: str = "ab" * 16) -> RegisterRequest:
    return RegisterRequest(
        claim_uid=uid, namespace="ns", name=f"claim-{uid[:8]}", token=token, shares=shares or (share(),)
    )


def existing_cgroups(parent: str, root: Path = CGROUP_ROOT) -> cgroups.Cgroups | None:
    """The claims' cgroups a daemon made under an existing ``parent`` (nothing is created or joined);
    None if absent."""
    if cgroup_layout.check_parent(parent):
        return None
    try:
        layout = cgroup_layout.parse_mountinfo(Path("/proc/self/mountinfo").read_text(), str(root))
    except OSError:
        return None
    if layout is None or not any((Path(h.mount) / parent).is_dir() for h in layout.hierarchies):
        return None
    return cgroups.Cgroups(layout, parent)


def holds(cg: cgroups.Cgroups, claim_uid: str, pid: int) -> bool:
    """Whether ``pid`` is in the claim's cgroup (by its ``/proc/<pid>/cgroup``)."""
    try:
        mine = cgroup_layout.parse_proc_cgroup(Path(f"/proc/{pid}/cgroup").read_text())
    except OSError:
        return False
    want = "/" + cg.relative(claim_uid)
    return any(mine.get(h.key, "").endswith(want) for h in cg.layout.hierarchies if h.key in mine)


def remove_cgroups(parent: str, root: Path = CGROUP_ROOT) -> None:
    """Remove a test daemon's cgroup parent and every claim cgroup under it (what a test leaves)."""
    found = existing_cgroups(parent, root)
    if found is None:
        return
    stayed = [uid for uid in sorted(found.claims()) if not found.remove(uid)]
    assert not stayed, f"claim cgroups under {parent} could not be removed: {stayed}"
    for h in found.layout.hierarchies:
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(Path(h.mount) / parent)


def gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent or a zombie)."""
    st = processes.stat(pid)
    return st is None or st.state in ("Z", "X")


class DaemonProc:
    """One flexnpu-daemon process under a private temp root and shm root."""

    def __init__(
        self,
        *,
        command: str | None = None,
        extra: tuple[str, ...] = (),
        same_node_as: DaemonProc | None = None,
    ) -> None:
        """``command``: an aclserver command line for ``--aclserver-command`` (None: the default).
        ``same_node_as``: a second instance on another daemon's directories, socket and cgroups
        (a rolling update's new pod); it logs to a file of its own.

        Each harness daemon gets a cgroup parent of its own (``--cgroup-parent``), so daemons of
        other tests on the same host never see, sweep or leak each other's claim cgroups."""
        if same_node_as is None:
            self.root = Path(tempfile.mkdtemp(prefix="fnd-", dir="/tmp"))
            self.shm_root = Path(tempfile.mkdtemp(prefix="fnd-", dir="/dev/shm"))
            self.log_name = "daemon.log"
        else:
            self.root, self.shm_root = same_node_as.root, same_node_as.shm_root
            self.log_name = f"daemon-{uuid.uuid4().hex[:6]}.log"
        self.cgroup_parent = f"flexnpu-test-{self.root.name}"
        self.command = command or default_command()
        self.extra = extra
        self.wrapper: list[str] = []
        """Run the daemon under this command (``setpriv …``, ``unshare …``)."""
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = None

    @property
    def socket(self) -> Path:
        return self.root / "d.sock"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def registry(self) -> Path:
        return self.state_dir / "registry.json"

    @property
    def log_path(self) -> Path:
        return self.root / self.log_name

    def argv(self) -> list[str]:
        return [
            *self.wrapper,
            sys.executable,
            "-m",
            "flexnpu_runtime.daemon.main",
            "--socket",
            str(self.socket),
            "--state-dir",
            str(self.state_dir),
            "--run-dir",
            str(self.run_dir),
            "--shm-root",
            str(self.shm_root),
            "--inventory",
            str(INVENTORY),
            *(["--aclserver-command", self.command] if self.command else []),
            "--monitor-interval",
            "0.1",
            "--log-level",
            "DEBUG",
            "--cgroup-parent",
            self.cgroup_parent,
            *self.extra,
        ]

    def start(self, *, wait: bool = True) -> DaemonProc:
        """Start the daemon; ``wait``: until its socket answers Health."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        if wait:
            wait_for(self._healthy, what=f"daemon health on {self.socket}")
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
        if not self.socket.exists():
            return False
        with DaemonClient(self.socket, timeout=2.0) as c:
            try:
                return c.health().ok
            except Exception:
                return False

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=15)
        finally:
            self.proc = None

    def client(self, timeout: float = 30.0) -> DaemonClient:
        return DaemonClient(self.socket, timeout=timeout)

    def smi(self, *args: str, socket_path: Path | None = None) -> subprocess.CompletedProcess[str]:
        return self._run(["kubeletplugin.smi", *args], FLEXNPU_DAEMON_SOCKET=str(socket_path or self.socket))

    def probe(self, kind: str = "daemon", *, instance: str = "") -> subprocess.CompletedProcess[str]:
        """``python3 -m dra_driver.probes daemon|daemon-ready`` in the environment the chart gives
        the daemon's container (``instance``: its pod UID)."""
        env = {"FLEXNPU_DAEMON_SOCKET": str(self.socket)}
        if instance:
            env["FLEXNPU_DAEMON_INSTANCE"] = instance
        return self._run(["dra_driver.probes", kind], **env)

    def _run(self, module_args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", *module_args],
            capture_output=True,
            text=True,
            env=dict(os.environ, **env),
            timeout=60,
            check=False,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def aclserver_pids(self) -> list[int]:
        return [
            pid for pid, _ in processes.find_aclservers(self.run_dir / "aclservers", run_dir=self.run_dir)
        ]

    def cleanup(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(Exception):
                self.stop(signal.SIGKILL)
        for pid in self.aclserver_pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not self.aclserver_pids(), timeout=5, what="aclservers gone")
        remove_cgroups(self.cgroup_parent)
        shmfs.unmount_all_under(self.shm_root)  # the claims' own tmpfs mounts, if the daemon made them
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.shm_root, ignore_errors=True)
