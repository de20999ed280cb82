"""Each aclserver in its own bounded cgroup on the host: detect, create, read, empty, remove, list.

:func:`open_cgroups` finds the hierarchies under ``--cgroup-root`` (``cgroup_layout``), joins the
host's cgroup namespace when the daemon runs in a container's own one (``setns`` on PID 1's,
which needs ``hostPID`` and CAP_SYS_ADMIN; on cgroup v2 with ``nsdelegate`` a process cannot be
moved out of its namespace otherwise), and creates the driver-owned parent in every hierarchy
(v2: enabling the ``memory``, ``pids`` and ``cpu`` controllers for its children; v1: copying
``cpuset.cpus``/``mems`` so a task may join). Anything that fails makes it answer a *problem*
sentence instead: the daemon then starts aclservers as it always did, in its own cgroup and
unbounded, and says why (log, ``Health``, ``flexnpu-smi info``).

:class:`Cgroups` creates ``<parent>/aclserver-<uid>`` with its bounds before the aclserver
starts; the launcher moves the new process in itself (``cgroup.procs`` of every hierarchy),
before the aclserver runs a line of its own. Paths are built only from validated claim UIDs
and the checked parent; files are opened with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dra_driver.errors import ErrorCode, StateError
from flexnpu_runtime.daemon import cgroup_layout as layout_
from flexnpu_runtime.daemon import ownership
from flexnpu_runtime.daemon.bounds import Bounds
from flexnpu_runtime.daemon.cgroup_layout import Figures, Hierarchy, Layout, Version

__all__ = ["Cgroups", "check_join", "enter_host_namespace", "open_cgroups"]

log = logging.getLogger("flexnpu.daemon")

PROC = Path("/proc")
_CLONE_NEWCGROUP = 0x02000000
_V2_CONTROLLERS = ("memory", "pids", "cpu")


class Cgroups:
    """The claims' cgroups under one parent, in every hierarchy of ``layout``. Holds no state but
    paths, so any thread may use it."""

    def __init__(self, layout: Layout, parent: str, *, owner: str = "") -> None:
        self.layout = layout
        self.parent = parent
        self.owner = owner
        """This daemon's install identity, recorded on each claim cgroup it makes (``ownership``)."""

    def describe(self) -> str:
        return f"{self.layout.describe()}, parent {self.parent}"

    def relative(self, claim_uid: str) -> str:
        """The claim's cgroup path below each hierarchy's root (what ``flexnpu-smi`` shows)."""
        return f"{self.parent}/{layout_.claim_dir_name(claim_uid)}"

    def create(self, claim_uid: str, bounds: Bounds) -> tuple[Path, ...]:
        """Make the claim's cgroup (or find it) and set its bounds; the ``cgroup.procs`` files a
        new process must be written to. Raises StateError (``CgroupFailed``) naming the file."""
        procs: list[Path] = []
        for h in self.layout.hierarchies:
            d = self._dir(h, claim_uid)
            try:
                _make_child(h, d)
                ownership.tag(d, self.owner)
            except OSError as exc:
                raise _failed(claim_uid, d, exc) from exc
            procs.append(d / "cgroup.procs")
        for w in layout_.limit_writes(self.layout, bounds):
            path = self._dir(w.hierarchy, claim_uid) / w.file
            try:
                _write(path, w.value)
            except OSError as exc:
                if w.required:
                    raise _failed(claim_uid, path, exc) from exc
                log.debug("claim %s: %s not set (%s)", claim_uid, path, exc.strerror or exc)
        return tuple(procs)

    def procs_files(self, claim_uid: str) -> tuple[Path, ...]:
        return tuple(self._dir(h, claim_uid) / "cgroup.procs" for h in self.layout.hierarchies)

    def exists(self, claim_uid: str) -> bool:
        return any(self._dir(h, claim_uid).is_dir() for h in self.layout.hierarchies)

    def members(self, claim_uid: str) -> list[int]:
        """Every process in the claim's cgroup, in any hierarchy."""
        pids: set[int] = set()
        for path in self.procs_files(claim_uid):
            with contextlib.suppress(OSError):
                pids.update(int(x) for x in path.read_text().split() if x.isdigit())
        return sorted(pids)

    def figures(self, claim_uid: str) -> Figures:
        """The claim's cgroup figures (-1 for what cannot be read)."""
        raw: dict[str, str] = {}
        for key, (h, name) in layout_.figure_files(self.layout).items():
            with contextlib.suppress(OSError):
                raw[key] = (self._dir(h, claim_uid) / name).read_text()
        return layout_.parse_figures(self.layout, raw)

    def empty(self, claim_uid: str, *, timeout: float) -> bool:
        """SIGKILL whatever is left in the claim's cgroup; True once it holds no process."""
        deadline = time.monotonic() + timeout
        delay = 0.002
        while True:
            left = self.members(claim_uid)
            if not left:
                return True
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)  # the kernel takes the killed tasks out of the cgroup
            delay = min(delay * 2, 0.02)

    def remove(self, claim_uid: str, *, timeout: float = 1.0) -> bool:
        """Empty and remove the claim's cgroup in every hierarchy; False (logged) if one stays."""
        if not self.empty(claim_uid, timeout=timeout):
            log.warning(
                "claim %s: cgroup %s still holds processes; kept", claim_uid, self.relative(claim_uid)
            )
            return False
        gone = True
        for h in self.layout.hierarchies:
            d = self._dir(h, claim_uid)
            try:
                os.rmdir(d)
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("claim %s: cannot remove cgroup %s: %s", claim_uid, d, exc.strerror or exc)
                gone = False
        return gone

    def owners(self, claim_uid: str) -> set[str]:
        """The install identities the claim's cgroup carries across hierarchies ("" for none)."""
        dirs = [self._dir(h, claim_uid) for h in self.layout.hierarchies]
        return {ownership.read_owner(d) for d in dirs if d.is_dir()}

    def remove_if_empty(self, claim_uid: str) -> bool:
        """Remove the claim's cgroup in every hierarchy where it holds no process (nothing is
        killed: the kernel refuses to remove a cgroup with tasks); True when none is left."""
        gone = True
        for h in self.layout.hierarchies:
            try:
                os.rmdir(self._dir(h, claim_uid))
            except FileNotFoundError:
                continue
            except OSError:
                gone = False
        return gone

    def claims(self) -> set[str]:
        """Claim UIDs that have a cgroup under the parent in some hierarchy."""
        out: set[str] = set()
        for h in self.layout.hierarchies:
            with contextlib.suppress(OSError):
                for entry in os.scandir(Path(h.mount) / self.parent):
                    if entry.name.startswith(layout_.CGROUP_PREFIX) and entry.is_dir(follow_symlinks=False):
                        out.add(entry.name[len(layout_.CGROUP_PREFIX) :])
        return out

    def _dir(self, h: Hierarchy, claim_uid: str) -> Path:
        return Path(h.mount) / self.parent / layout_.claim_dir_name(claim_uid)


def open_cgroups(root: Path, parent: str, *, enter_host: bool = True) -> tuple[Cgroups | None, str]:
    """The claims' cgroups under ``root``/``parent``, or None and why they cannot be used here."""
    why = layout_.check_parent(parent)
    if why:
        return None, f"--cgroup-parent {parent!r} {why}"
    if enter_host:
        problem = enter_host_namespace()
        if problem:
            return None, problem
    try:
        text = (PROC / "self" / "mountinfo").read_text()
        own = layout_.parse_proc_cgroup((PROC / "self" / "cgroup").read_text())
    except OSError as exc:
        return None, f"cannot read the process's mounts or cgroups: {exc.strerror or exc}"
    layout = layout_.parse_mountinfo(text, str(root))
    if layout is None:
        return None, f"no cgroup hierarchy is mounted at {root} (--cgroup-root)"
    inside = layout_.inside_own(layout, parent, own)
    if inside:
        return None, (
            f"{inside}: aclservers there would die with the daemon's container (mount the host's"
            " cgroup file system and give the pod hostPID)"
        )
    try:
        _make_parent(layout, parent)
    except OSError as exc:
        return None, f"cannot create the cgroup {exc.filename or parent}: {exc.strerror or exc}"
    found = Cgroups(layout, parent)
    problem = check_join(found)
    return (None, problem) if problem else (found, "")


PROBE_PREFIX = "probe-"
"""The join check's own cgroup below the parent (``probe-<daemon pid>``; never a claim's)."""


def check_join(cg: Cgroups) -> str:
    """Move a process of ours into a cgroup below the parent in every hierarchy, as a launch does, and
    see it arrive; the problem, or "". Found at start, so a host where the kernel refuses the move
    (a cgroup namespace boundary, a missing permission) runs aclservers unbounded with a warning
    instead of failing every register with ``CgroupFailed``. Stale probes of earlier daemons go."""
    for h in cg.layout.hierarchies:
        with contextlib.suppress(OSError):
            for entry in os.scandir(Path(h.mount) / cg.parent):
                if entry.name.startswith(PROBE_PREFIX) and entry.is_dir(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.rmdir(entry.path)  # only an empty cgroup can be removed: a live one stays
    name = f"{PROBE_PREFIX}{os.getpid()}"
    dirs = [Path(h.mount) / cg.parent / name for h in cg.layout.hierarchies]
    child = subprocess.Popen(  # waits on its stdin: ends when we close it
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, close_fds=True
    )
    try:
        for h, d in zip(cg.layout.hierarchies, dirs, strict=True):
            try:
                _make_child(h, d)
                _write(d / "cgroup.procs", str(child.pid))
            except OSError as exc:
                return f"cannot move a process into the cgroup {d}: {exc.strerror or exc}"
        try:
            mine = layout_.parse_proc_cgroup((PROC / str(child.pid) / "cgroup").read_text())
        except OSError as exc:
            return (
                f"cannot read the cgroups of a process moved into {cg.parent}/{name}: {exc.strerror or exc}"
            )
        want = f"/{cg.parent}/{name}"
        missed = [h.key for h in cg.layout.hierarchies if not mine.get(h.key, "").endswith(want)]
        if missed:
            return f"a process moved into {cg.parent}/{name} did not arrive there (hierarchies {', '.join(missed)})"
        return ""
    finally:
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        _remove_when_empty(dirs, timeout=1.0)


def _remove_when_empty(dirs: list[Path], *, timeout: float) -> None:
    """rmdir each of ``dirs`` once the kernel took the exited task out (EBUSY until then); what stays
    is removed by the next daemon's check."""
    deadline = time.monotonic() + timeout
    left = list(dirs)
    while left:
        busy = []
        for d in left:
            try:
                os.rmdir(d)
            except OSError as exc:
                if exc.errno == errno.EBUSY:
                    busy.append(d)
        left = busy
        if not left or time.monotonic() >= deadline:
            return
        time.sleep(0.005)  # the kernel's removal of an exited task; no event to wait on


def enter_host_namespace() -> str:
    """Join PID 1's cgroup namespace if the daemon's own is another (a container's); the problem, or ""."""
    try:
        mine = os.readlink(PROC / "self" / "ns" / "cgroup")
    except OSError:
        return ""  # no cgroup namespaces on this kernel: nothing to join
    try:
        host = os.readlink(PROC / "1" / "ns" / "cgroup")
    except OSError as exc:  # PID 1 holds capabilities we lack: it is no container's init, go on
        log.debug("cannot compare with PID 1's cgroup namespace: %s", exc.strerror or exc)
        return ""
    if mine == host:
        return ""
    fd = os.open(PROC / "1" / "ns" / "cgroup", os.O_RDONLY | os.O_CLOEXEC)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, _CLONE_NEWCGROUP) != 0:
            err = ctypes.get_errno()
            return f"cannot join the host's cgroup namespace: {os.strerror(err)} (needs CAP_SYS_ADMIN)"
    finally:
        os.close(fd)
    log.info("joined the host's cgroup namespace %s (was %s)", host, mine)
    return ""


def _make_parent(layout: Layout, parent: str) -> None:
    """Create ``parent`` (and the directories above it) in every hierarchy, ready for claims."""
    for h in layout.hierarchies:
        here = Path(h.mount)
        for part in parent.split("/"):
            if layout.version is Version.V2:
                _enable_controllers(here)
            here = here / part
            with contextlib.suppress(FileExistsError):
                os.mkdir(here, 0o755)
            if "cpuset" in h.controllers:
                _inherit_cpuset(here)
        if layout.version is Version.V2:
            _enable_controllers(here)


def _enable_controllers(cgroup: Path) -> None:
    """v2: let ``cgroup``'s children use the controllers we set (those the host offers)."""
    offered = set((cgroup / "cgroup.controllers").read_text().split())
    enabled = set((cgroup / "cgroup.subtree_control").read_text().split())
    want = [c for c in _V2_CONTROLLERS if c in offered and c not in enabled]
    if want:
        _write(cgroup / "cgroup.subtree_control", " ".join(f"+{c}" for c in want))


def _make_child(h: Hierarchy, d: Path) -> None:
    """Make (or find) the cgroup ``d`` below the parent in ``h``, ready for a task to join."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(d, 0o755)
    if "cpuset" in h.controllers:
        _inherit_cpuset(d)


def _inherit_cpuset(cgroup: Path) -> None:
    """v1 cpuset: a new cgroup has no CPUs or memory nodes until given its parent's."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        if not (cgroup / name).read_text().strip():
            _write(cgroup / name, (cgroup.parent / name).read_text().strip())


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _failed(claim_uid: str, path: Path, exc: OSError) -> StateError:
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        reason += " (the daemon needs write access to the host's cgroup file system)"
    return StateError(
        f"cannot set up the aclserver's cgroup at {path}: {reason}",
        code=ErrorCode.CGROUP_FAILED,
        claim_uid=claim_uid,
        field="cgroup",
    )
