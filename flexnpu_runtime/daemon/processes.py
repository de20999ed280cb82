"""Processes: /proc identity, launching an aclserver, waiting for readiness, stopping its group.

A process is "ours" only if its PID, its start time (``/proc/<pid>/stat`` field 22) and, where
recorded, its command line all match, so a reused PID is never signalled. Zombies count as
dead: on some nodes PID 1 does not reap orphans. Nothing here decides *when* to act.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_driver import wirefiles
from dra_driver.errors import ErrorCode, FlexNPUError, StateError
from flexnpu_runtime.daemon import claim_files, zygote_marker
from flexnpu_runtime.daemon.zygote_marker import JOIN_CGROUP_STATUS
from flexnpu_wire.launch import ReadyInfo

PROC = Path("/proc")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, slots=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    pgrp: int
    start_time: int


def stat(pid: int) -> ProcStat | None:
    """Parsed ``/proc/<pid>/stat``, or None when there is no such process."""
    try:
        raw = (PROC / str(pid) / "stat").read_bytes().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may contain spaces and parentheses: split after the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    return ProcStat(pid=pid, state=rest[0], ppid=int(rest[1]), pgrp=int(rest[2]), start_time=int(rest[19]))


def cmdline(pid: int) -> tuple[str, ...] | None:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)


def is_alive(pid: int, start_time: int, expected_cmdline: Sequence[str] = ()) -> bool:
    """True if ``pid`` runs (not a zombie), started at ``start_time`` and, if given, has that cmdline."""
    st = stat(pid) if pid > 0 else None
    if st is None or st.state in ("Z", "X") or st.start_time != start_time:
        return False
    return not expected_cmdline or cmdline(pid) == tuple(expected_cmdline)


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` in bytes, -1 when unknown."""
    try:
        fields = (PROC / str(pid) / "statm").read_text().split()
        return int(fields[1]) * _PAGE
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return -1


def live_group_members(pgid: int) -> list[int]:
    """PIDs in process group ``pgid`` that are not zombies."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    out = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            st = stat(int(entry.name))
            if st is not None and st.pgrp == pgid and st.state not in ("Z", "X"):
                out.append(st.pid)
    return out


@dataclass(slots=True)
class Launched:
    """A started aclserver: its PID (= process group ID) and identity."""

    pid: int
    start_time: int
    cmdline: tuple[str, ...]
    popen: subprocess.Popen[bytes] | None

    def exit_status(self) -> int | None:
        """The exit status if our child has exited (reaping it), else None."""
        return self.popen.poll() if self.popen is not None else None


_JOIN = (
    'while [ "$1" != -- ]; do echo $$ > "$1" || exit ' + str(JOIN_CGROUP_STATUS) + "; shift; done;"
    ' shift; exec "$@"'
)
"""A POSIX shell moves itself (``$$``) into each cgroup, then becomes the aclserver (same PID)."""


def launch(
    command: Sequence[str], *, spec_path: Path, stderr_path: Path, cgroup: Sequence[Path] = ()
) -> Launched:
    """Start ``command --spec <spec_path>`` in its own session, stderr captured to a file.

    With ``cgroup`` (``cgroup.procs`` files), the process joins those cgroups before ``command``
    runs: ``/bin/sh`` writes its own PID to each, then execs the command, keeping the PID. No
    pipe is shared with the daemon, so the aclserver outlives a daemon restart unharmed; no
    parent-death signal is set.
    """
    stderr_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    argv = [*command, "--spec", str(spec_path)]
    if cgroup:
        argv = ["/bin/sh", "-c", _JOIN, "flexnpu-cgroup-join", *map(str, cgroup), "--", *argv]
    with stderr_path.open("ab") as err:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            start_new_session=True,
            close_fds=True,
        )
    st = stat(popen.pid)
    return Launched(pid=popen.pid, start_time=st.start_time if st else 0, cmdline=tuple(argv), popen=popen)


def wait_ready(
    launched: Launched, *, ready_path: Path, stderr_path: Path, timeout: float, claim_uid: str
) -> ReadyInfo:
    """Wait until the aclserver writes its ready file; raise if it exits or the deadline passes."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        ready = wirefiles.read_ready(ready_path)
        if ready is not None and ready.pid == launched.pid:
            return ready
        status = launched.exit_status()
        if status is None and launched.popen is None and not is_alive(launched.pid, launched.start_time):
            status = -1
        if status is not None:
            joined = status != JOIN_CGROUP_STATUS
            raise (FlexNPUError if joined else StateError)(
                f"aclserver exited with status {status} before it was ready"
                f"{'' if joined else ' (it could not join its cgroup)'};"
                f" stderr: {claim_files.stderr_tail(stderr_path) or '(empty)'}",
                code=ErrorCode.INTERNAL if joined else ErrorCode.CGROUP_FAILED,
                claim_uid=claim_uid,
                field=None if joined else "cgroup",
            )
        if time.monotonic() >= deadline:
            raise FlexNPUError(
                f"aclserver (pid {launched.pid}) was not ready within {timeout:.1f}s;"
                f" stderr: {claim_files.stderr_tail(stderr_path) or '(empty)'}",
                code=ErrorCode.INTERNAL,
                claim_uid=claim_uid,
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.01)


def stop_group(
    pid: int, *, start_time: int, timeout: float, reap: Callable[[], object] = lambda: None
) -> bool:
    """SIGTERM process group ``pid``, wait up to ``timeout``, then SIGKILL it; True when it is gone.

    The group is left alone when its leader is alive but is not the process we started (PID
    reuse). A group whose leader already died is still signalled: its PID cannot be reused
    while the group exists.
    """
    st = stat(pid) if pid > 0 else None
    if st is not None and st.state not in ("Z", "X") and st.start_time != start_time:
        return True  # a different process now; ours is long gone
    if pid <= 0:
        return True
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, max(timeout, 1.0))):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        if _wait_group_gone(pid, wait, reap):
            return True
    return False


def group_gone(pgid: int) -> bool:
    """True when no live process is in group ``pgid``. Cheap while it is (one signal check and
    the leader's stat); the whole process table is read only when the leader is gone but the
    group still answers (members left, or zombies nobody reaps)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    st = stat(pgid)
    if st is not None and st.state not in ("Z", "X") and st.pgrp == pgid:
        return False
    return not live_group_members(pgid)


def _wait_group_gone(pgid: int, timeout: float, reap: Callable[[], object]) -> bool:
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        reap()
        if group_gone(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 1.5, 0.02)


def sees_same(pid: int, path: Path) -> bool:
    """Whether ``path``, looked up in process ``pid``'s root (its mount namespace), is the very
    directory or file this process sees there (same device and inode). With ``hostPID`` a daemon
    sees the processes of other containers, whose paths may read the same and be other files."""
    try:
        theirs = os.stat(PROC / str(pid) / "root" / str(path).lstrip("/"))
        mine = os.stat(path)
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (mine.st_dev, mine.st_ino)


def find_aclservers(spec_dir: Path, *, run_dir: Path) -> list[tuple[int, str]]:
    """Live aclservers this daemon started: ``--spec <file in spec_dir>`` on the command line, or
    forked by our zygote (its command line, and leading its own session), where that directory is
    the one this daemon uses (:func:`sees_same`: not another daemon's that reads the same). Returns
    (pid, why).
    """
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        args = cmdline(pid)
        if not args:
            continue
        why = ""
        if "--spec" in args:
            i = args.index("--spec")
            if i + 1 < len(args) and Path(args[i + 1]).parent == spec_dir and sees_same(pid, spec_dir):
                why = f"spec {args[i + 1]}"
        if not why and zygote_marker.is_zygote_cmdline(args, run_dir) and sees_same(pid, run_dir):
            st = stat(pid)
            if st is not None and st.pgrp == pid:
                why = "forked by the zygote"
        if why:
            st = stat(pid)
            if st is not None and st.state not in ("Z", "X"):
                found.append((pid, why))
    return sorted(found)


def port_free(host: str, port: int) -> bool:
    """True if a TCP listener could bind ``host:port`` now (best effort; racy by nature)."""
    if port <= 0:
        return False
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
