"""Whether a claim's shm tmpfs reaches its containers, and making the shm root a shared mount.

The daemon bounds what a claim's containers can write to their shm dir by mounting a size-limited
tmpfs on it (``flexnpu_runtime/daemon/shmfs.py``). That bound holds only if the container runtime sees
that tmpfs when it bind-mounts the dir into the claim's containers, which is so when

* the daemon runs in the runtime's mount namespace (the host's: the initial PID namespace and the
  mount namespace of PID 1): what it mounts is what the runtime resolves, whatever the
  propagation of the shm root; or
* the mount holding the shm root has shared propagation (a pod's ``Bidirectional`` volume on a
  shared host mount), so a mount the daemon makes in its own namespace appears on the host.

:func:`decide` (pure) turns the operator's ``--shm-mount`` choice and those facts into what the
daemon does: mount, plain directories (``never``, the operator's explicit choice), or a *problem*
- a sentence saying why the bound cannot be kept - for which every new share is refused (its
prepare fails naming the claim and the reason), the daemon's Health and readiness probe say so,
and so does the node's log, a Node Event and its readiness.

:func:`share_root` removes the host prerequisite: it makes the shm root a shared mount point in
the host's mount namespace (a bind mount of the directory onto itself, then ``MS_SHARED``, as the
kubelet does for its own root directory), so that a ``Bidirectional`` volume of it is accepted
by containerd and propagates. The chart runs it as the daemon pod's init container
(``python3 -m flexnpu_runtime.daemon.shmroot --host-proc /host/proc /dev/shm/flexnpu``), entering the
host's mount namespace through the host's ``/proc`` mounted into it. Nothing is done when the
directory already lies on a shared mount. A symlink is never followed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import os
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ShmBound",
    "decide",
    "host_namespace",
    "in_runtime_namespace",
    "may_mount",
    "propagates",
    "share_root",
]

MODES = ("auto", "always", "never")
INITIAL_PID_NS_INODE = 0xEFFFFFFC  # PROC_PID_INIT_INO: the kernel's initial PID namespace
CAP_SYS_ADMIN = 21
_MS_BIND, _MS_REC, _MS_SHARED = 0x1000, 0x4000, 1 << 20
_CLONE_NEWNS = 0x00020000


@dataclass(frozen=True, slots=True)
class ShmBound:
    """What the daemon does with each claim's shm dir."""

    mount: bool  # give it its own size-limited tmpfs
    problem: str = ""  # why the bound cannot be kept ("" = it is kept, or the operator chose never)


def decide(mode: str, *, root: Path, may_mount: bool, runtime_namespace: bool, shared: bool) -> ShmBound:
    """The daemon's shm decision (pure); ``mode`` is ``--shm-mount`` (auto | always | never)."""
    if mode == "never":
        return ShmBound(mount=False)
    if mode == "always":
        return ShmBound(mount=True)
    if not may_mount:
        return ShmBound(
            mount=False,
            problem="the daemon may not mount a claim's tmpfs (no CAP_SYS_ADMIN: run it privileged),"
            " so a claim's containers could fill the node's shared memory; --shm-mount never accepts that",
        )
    if runtime_namespace or shared:
        return ShmBound(mount=True)
    return ShmBound(
        mount=False,
        problem=f"the shm root {root} is not on a shared mount and the daemon runs in a mount namespace of"
        " its own, so a claim's tmpfs would not reach its containers: make the root a shared mount"
        f" (python3 -m flexnpu_runtime.daemon.shmroot --host-proc <host /proc> {root}, as the chart's init"
        " container does) and mount it with mountPropagation: Bidirectional; --shm-mount never accepts"
        " unbounded shm dirs",
    )


def in_runtime_namespace() -> bool:
    """Whether this process shares the host's mount namespace (the runtime's): it is in the initial
    PID namespace and in the mount namespace of :func:`host_namespace`."""
    try:
        if os.stat("/proc/self/ns/pid").st_ino != INITIAL_PID_NS_INODE:
            return False
        mine = os.stat("/proc/self/ns/mnt")
        host = os.stat(host_namespace(Path("/proc")))
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (host.st_dev, host.st_ino)


def host_namespace(proc: Path) -> Path:
    """The host's mount namespace file under the host's ``proc``: PID 1's, or where a sandbox keeps
    PID 1 unreadable, PID 2's (``kthreadd``, which runs in the initial mount namespace, as init)."""
    init = proc / "1" / "ns" / "mnt"
    try:
        os.stat(init)
    except PermissionError:
        with contextlib.suppress(OSError):
            if (proc / "2" / "comm").read_text().strip() == "kthreadd":
                return proc / "2" / "ns" / "mnt"
    return init


def may_mount() -> bool:
    """Whether this process has CAP_SYS_ADMIN (effective), which mounting a tmpfs needs."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    return os.geteuid() == 0


def propagates(path: Path) -> bool:
    """True if mounts made under ``path`` reach the other mount namespaces (the host, and through
    it the containers): the mount holding ``path`` has shared propagation."""
    found = _holding_mount(path, "/proc/self/mountinfo")
    return found is not None and found.shared


def share_root(root: Path, *, host_proc: Path | None) -> str:
    """Make ``root`` a shared mount point in the host's mount namespace; what was done, as a sentence.

    ``host_proc`` is the host's ``/proc`` as mounted here (:func:`host_namespace` is entered);
    None means this process already is in the host's mount namespace. Idempotent; OSError on failure.
    """
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, f"{root} is not a directory (a symlink is never followed)")
    here = _holding_mount(root, "/proc/self/mountinfo")
    if here is None:
        raise OSError(errno.ENOENT, f"no mount holds {root} in /proc/self/mountinfo")
    below = "" if str(root) == here.point else os.path.relpath(root, here.point)
    inside = (here.fs_root.rstrip("/") + "/" + below).rstrip("/") or "/"
    libc = _libc()  # loaded before the namespace changes (the host's files are not ours to load)
    if host_proc is not None:
        fd = os.open(host_namespace(host_proc), os.O_RDONLY | os.O_CLOEXEC)
        try:
            if libc.setns(fd, _CLONE_NEWNS):
                err = ctypes.get_errno()
                raise OSError(err, f"cannot enter the host's mount namespace: {os.strerror(err)}")
        finally:
            os.close(fd)
    host = _host_path(here.dev, inside, (st.st_dev, st.st_ino))
    holding = _holding_mount(host, "/proc/self/mountinfo")
    if holding is not None and holding.shared:
        return f"{host} is on a shared mount already ({holding.point}); nothing to do"
    if holding is None or holding.point != str(host):
        _mount(str(host), str(host), _MS_BIND | _MS_REC)
    _mount("none", str(host), _MS_SHARED | _MS_REC)
    return f"{host} is now a shared mount point (bind-mounted onto itself)"


@dataclass(frozen=True, slots=True)
class _Mount:
    point: str
    fs_root: str  # the directory of the file system mounted there
    dev: str  # "major:minor"
    shared: bool


def _mounts(mountinfo: str) -> list[_Mount]:
    out = []
    with open(mountinfo, "rb") as fh:
        for raw in fh:
            fields = raw.decode(errors="replace").split()
            sep = fields.index("-")
            optional = fields[6:sep]
            out.append(
                _Mount(
                    point=_unescape(fields[4]),
                    fs_root=_unescape(fields[3]),
                    dev=fields[2],
                    shared=any(f.startswith("shared:") for f in optional),
                )
            )
    return out


def _holding_mount(path: Path, mountinfo: str) -> _Mount | None:
    """The mount ``path`` lies on (the last of the deepest mount points that contain it)."""
    target = str(path).rstrip("/") or "/"
    best: _Mount | None = None
    with contextlib.suppress(OSError):
        for m in _mounts(mountinfo):
            inside = target == m.point or target.startswith(m.point.rstrip("/") + "/")
            if inside and (best is None or len(m.point) >= len(best.point)):
                best = m
    return best


def _host_path(dev: str, inside: str, ident: tuple[int, int]) -> Path:
    """Where the directory ``inside`` of file system ``dev`` is in this (the host's) namespace."""
    for m in _mounts("/proc/self/mountinfo"):
        root = m.fs_root.rstrip("/")
        if m.dev != dev or not (inside == root or inside.startswith(root + "/") or root == ""):
            continue
        candidate = Path(m.point) / inside[len(root) :].lstrip("/")
        with contextlib.suppress(OSError):
            st = os.lstat(candidate)
            if stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) == ident:
                return candidate
    raise OSError(errno.ENOENT, f"the shm root ({dev}:{inside}) is not visible in the host's mount namespace")


def _mount(source: str, target: str, flags: int) -> None:
    if _libc().mount(source.encode(), target.encode(), None, flags, None):
        err = ctypes.get_errno()
        raise OSError(err, f"cannot mount {target}: {os.strerror(err)}")


def _unescape(text: str) -> str:
    return text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


_LIBC: list[ctypes.CDLL] = []


def _libc() -> ctypes.CDLL:
    if not _LIBC:
        _LIBC.append(ctypes.CDLL("libc.so.6", use_errno=True))
    return _LIBC[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m flexnpu_runtime.daemon.shmroot",
        description="Make the daemon's shm root a shared mount point in the host's mount namespace.",
    )
    parser.add_argument("root", type=Path, help="the shm root, as mounted here (e.g. /dev/shm/flexnpu)")
    parser.add_argument(
        "--host-proc",
        type=Path,
        default=None,
        help="the host's /proc as mounted here; without it this process must be in the host's namespace",
    )
    args = parser.parse_args(argv)
    try:
        args.root.mkdir(parents=True, exist_ok=True)
        print(share_root(args.root.absolute(), host_proc=args.host_proc))
    except OSError as exc:
        print(f"shmroot: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
