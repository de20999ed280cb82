"""Podman as the real CDI consumer of the e2e tests: a throwaway, isolated podman instance.

A :class:`Podman` owns one temporary directory holding everything podman and runc write for
it: a busybox rootfs (no image pull), ``containers.conf`` (runc, lowered ulimits, file locks
instead of the machine-wide ``/dev/shm/libpod_lock``, no events log), ``storage.conf`` (vfs
graph root and run root), podman's tmp dir and its network config dir. Tests in parallel each
use their own instance; :meth:`Podman.close` removes the directory.

Where podman reads CDI specs: podman 4.3.1 (Debian 12) only scans ``/etc/cdi`` and
``/var/run/cdi``; it has no flag, and ``containers.conf [engine] cdi_spec_dirs`` is ignored
(at ``--log-level=debug`` it logs ``Failed to decode the keys ["engine.cdi_spec_dirs"]``; the
option arrived in podman 5.5 as ``--cdi-spec-dir``). So every podman command runs in private
mount and PID namespaces (``unshare --mount --propagation private --pid --fork``) where a tmpfs
covers ``/run`` (= ``/var/run``), the requested spec directory is bind-mounted at
``/run/cdi``, the host's ``/run/netns`` is carried over (for ``--network ns:``), and
``/etc/cdi``, when present, is hidden under an empty tmpfs. Podman sees exactly that
directory's specs; what rootful podman and runc insist on writing under ``/run``
(``/run/runc``, ``/run/containers/networks``) lands in the tmpfs; the host sees no mount. As
PID 1 of its namespace podman takes conmon and the ``container cleanup`` process with it when
it exits, so nothing outlives :meth:`Podman.run`, and a timeout kills the whole tree.

Left on the machine: cgroupfs's ``/sys/fs/cgroup/*/libpod_parent`` (and its ``conmon``
child), which podman creates once and shares; container cgroups are removed.

Working recipe: runc, explicit ulimits and a busybox rootfs (podman 4.3.1 on Debian 12 accepts
cdiVersion 0.5.0 at most and reports every bad spec as "unresolvable CDI devices").
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal

__all__ = [
    "BUSYBOX",
    "HOST_CDI_DIRS",
    "REQUIRED_APPLETS",
    "UNRESOLVABLE",
    "Podman",
    "build_rootfs",
    "ensure_available",
    "podman_version",
]

#: The statically linked busybox of Debian's ``busybox-static``: the whole container rootfs.
BUSYBOX = Path("/bin/busybox")

#: The only spec directories podman 4.3.1 reads (lowest priority first).
HOST_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")

#: Podman's user-visible error for a CDI ID it cannot resolve (rc 126); the cause of a spec
#: that failed to load is only logged at ``--log-level=debug``.
UNRESOLVABLE = "unresolvable CDI devices"

#: Applets the tests rely on; :func:`build_rootfs` links every applet busybox has.
REQUIRED_APPLETS = (
    "sh", "cat", "ls", "stat", "touch", "env", "grep", "nc", "dd", "mount", "echo", "test",
    "printf", "mkdir", "rm", "head", "wc", "id", "ip", "sleep", "true", "false",
)  # fmt: skip

#: CDI support with cdiVersion 0.3.0 specs arrived in podman 4.1.
_MIN_VERSION = (4, 1)

_CONTAINERS_CONF = """\
# Written by flexnpu_testing.podman: the working recipe above.
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "none"
lock_type = "file"
tmp_dir = "{tmp}"
network_config_dir = "{net}"
"""

_STORAGE_CONF = """\
[storage]
driver = "vfs"
graphroot = "{root}"
runroot = "{runroot}"
"""

# Runs as PID 1 of the private namespaces. $1: the CDI spec dir, $2: an empty dir that holds
# the host's /run/netns while a tmpfs covers /run; the rest is the command.
_NS_SCRIPT = """\
set -e
spec_dir=$1
hold=$2
shift 2
netns=
if [ -d /run/netns ]; then mount --rbind /run/netns "$hold"; netns=1; fi
mount -t tmpfs -o mode=0755,size=64m flexnpu-e2e-run /run
mkdir /run/cdi /run/netns
mount --bind "$spec_dir" /run/cdi
if [ -n "$netns" ]; then mount --move "$hold" /run/netns; fi
if [ -d /etc/cdi ]; then mount -t tmpfs -o ro,size=4k,mode=0755 flexnpu-e2e-no-cdi /etc/cdi; fi
exec "$@"
"""

_NETNS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _is_static_elf(path: Path) -> bool:
    """True for an ELF executable without a program interpreter (PT_INTERP)."""
    with path.open("rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only; enough for Debian amd64/arm64
            return False
        order: Literal["little", "big"] = "little" if head[5] == 1 else "big"
        phoff = int.from_bytes(head[0x20:0x28], order)
        phentsize = int.from_bytes(head[0x36:0x38], order)
        phnum = int.from_bytes(head[0x38:0x3A], order)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    pt_interp = 3
    types = (int.from_bytes(table[i : i + 4], order) for i in range(0, len(table), phentsize))
    return pt_interp not in types


def podman_version(podman: str = "podman") -> tuple[int, ...] | None:
    """``podman --version`` as a tuple, e.g. ``(4, 3, 1)``; None when it cannot be run."""
    try:
        out = subprocess.run([podman, "--version"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", out.stdout)
    return tuple(int(x) for x in m.groups()) if m else None


def ensure_available() -> str | None:
    """Why podman cannot run the e2e tests here, or None when it can (no container is run)."""
    if sys.platform != "linux":
        return f"podman e2e tests need Linux, not {sys.platform}"
    if os.geteuid() != 0:
        return f"podman e2e tests need root (running as uid {os.geteuid()}): rootful podman, mounts, mknod"
    tools = (
        ("podman", "podman"),
        ("runc", "runc"),
        ("conmon", "conmon"),
        ("unshare", "util-linux"),
        ("mount", "mount"),
    )
    for tool, package in tools:
        if shutil.which(tool) is None and not (
            tool == "conmon" and Path("/usr/libexec/podman/conmon").exists()
        ):
            return f"{tool} not found on PATH (apt-get install {package})"
    if not BUSYBOX.is_file():
        return f"{BUSYBOX} not found (apt-get install busybox-static)"
    if not _is_static_elf(BUSYBOX):
        return f"{BUSYBOX} is not a static executable; the rootfs needs it (apt-get install busybox-static)"
    version = podman_version()
    if version is None:
        return "`podman --version` failed or printed no version"
    if version[:2] < _MIN_VERSION:
        return f"podman {'.'.join(map(str, version))} has no CDI support (need >= 4.1)"
    return None


def build_rootfs(root: Path, busybox: Path = BUSYBOX) -> Path:
    """A minimal container rootfs at ``root``: static busybox and a symlink per applet."""
    for d in ("bin", "etc", "proc", "sys", "dev", "run", "var/tmp", "root"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir(mode=0o1777, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    target = root / "bin" / "busybox"
    shutil.copy2(busybox, target)
    listed = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, timeout=20, check=True)
    applets = {a for a in listed.stdout.split() if a and "/" not in a and a != "busybox"}
    missing = sorted(set(REQUIRED_APPLETS) - applets)
    if missing:
        raise RuntimeError(f"{busybox} lacks the applets {missing}")
    for applet in sorted(applets):
        link = root / "bin" / applet
        if not link.is_symlink():
            link.symlink_to("busybox")
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    return root


class Podman:
    """One isolated podman instance (storage, locks, config, rootfs) under a temp directory."""

    def __init__(self, base_dir: Path | None = None) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="fnpu-podman-", dir=base_dir))
        try:
            self.rootfs = build_rootfs(self.workdir / "rootfs")
            dirs = {k: self.workdir / k for k in ("root", "runroot", "tmp", "net", "nocdi", "netns-hold")}
            for d in dirs.values():
                d.mkdir(mode=0o700)
            self.containers_conf = self.workdir / "containers.conf"
            self.containers_conf.write_text(_CONTAINERS_CONF.format(tmp=dirs["tmp"], net=dirs["net"]))
            self.storage_conf = self.workdir / "storage.conf"
            self.storage_conf.write_text(_STORAGE_CONF.format(root=dirs["root"], runroot=dirs["runroot"]))
            self._empty_cdi = dirs["nocdi"]
            self._tmp = dirs["tmp"]
            self._netns_hold = dirs["netns-hold"]
        except BaseException:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise
        self.closed = False

    @staticmethod
    def ensure_available() -> str | None:
        """Why podman cannot run the e2e tests here, or None (see :func:`ensure_available`)."""
        return ensure_available()

    def __enter__(self) -> Podman:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def env(self) -> dict[str, str]:
        """The environment every podman command of this instance runs with."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTAINERS_", "CONTAINER_"))}
        env.update(
            {
                "CONTAINERS_CONF": str(self.containers_conf),
                "CONTAINERS_STORAGE_CONF": str(self.storage_conf),
                "TMPDIR": str(self._tmp),
            }
        )
        return env

    def command(self, podman_args: Sequence[str], *, cdi_spec_dir: Path | None = None) -> list[str]:
        """argv running ``podman <podman_args>`` in private mount and PID namespaces (pure)."""
        spec_dir = cdi_spec_dir if cdi_spec_dir is not None else self._empty_cdi
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--",
            "/bin/sh",
            "-c",
            _NS_SCRIPT,
            "flexnpu-podman",
            str(spec_dir),
            str(self._netns_hold),
            "podman",
            *podman_args,
        ]

    def run_args(
        self,
        *,
        cdi_ids: Sequence[str],
        command: str,
        netns: str | None = None,
        log_level: str | None = None,
        read_only: Sequence[str] = (),
    ) -> list[str]:
        """The ``podman`` arguments of one ``run`` (pure). ``read_only``: host directories bind-mounted
        read-only at the same path in the container (a test's Python environment, say)."""
        if netns is not None and not _NETNS_RE.match(netns):
            raise ValueError(f"invalid network namespace name {netns!r}")
        args = [f"--log-level={log_level}"] if log_level else []
        args += ["run", "--rm", "--pull=never", f"--network={f'ns:/run/netns/{netns}' if netns else 'none'}"]
        for path in read_only:
            if not path.startswith("/") or ":" in path or "," in path:
                raise ValueError(
                    f"a read-only mount must be an absolute path without ':' or ',', got {path!r}"
                )
            args += ["--volume", f"{path}:{path}:ro"]
        for cdi_id in cdi_ids:
            args += ["--device", cdi_id]
        args += ["--rootfs", str(self.rootfs), "/bin/sh", "-c", command]
        return args

    def run(
        self,
        *,
        cdi_ids: Sequence[str],
        cdi_spec_dir: Path,
        command: str,
        netns: str | None = None,
        timeout: float = 60,
        log_level: str | None = None,
        read_only: Sequence[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        """Run ``/bin/sh -c command`` in a container with ``cdi_ids`` injected from ``cdi_spec_dir``.

        Network: none, or the existing namespace ``/run/netns/<netns>``. Returns podman's result
        (rc 126 and :data:`UNRESOLVABLE` on stderr for a CDI ID no loaded spec defines).
        ``log_level="debug"`` puts podman's reason for rejecting a spec on stderr; use it only for
        runs that fail before the container starts: after a debug run whose container did start,
        podman 4.3.1 waits out its 20 s conmon timeout.
        Raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds (the run is killed).
        """
        if self.closed:
            raise RuntimeError("this Podman instance is closed")
        spec_dir = Path(cdi_spec_dir).resolve()
        if not spec_dir.is_dir():
            raise FileNotFoundError(f"CDI spec dir {spec_dir} does not exist")
        argv = self.command(
            self.run_args(
                cdi_ids=cdi_ids, command=command, netns=netns, log_level=log_level, read_only=read_only
            ),
            cdi_spec_dir=spec_dir,
        )
        return subprocess.run(
            argv, env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
        )

    def podman(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Any other podman command against this instance (no CDI specs visible)."""
        return subprocess.run(
            self.command(args), env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
        )

    def containers(self) -> list[str]:
        """IDs of every container of this instance, running or not (``podman ps -a``)."""
        res = self.podman("ps", "-a", "-q", "--no-trunc")
        if res.returncode != 0:
            raise RuntimeError(f"podman ps -a failed (rc {res.returncode}): {res.stderr.strip()}")
        return res.stdout.split()

    def close(self) -> None:
        """Remove any container left behind, then the whole work directory (idempotent).

        A run killed by its timeout leaves its container in podman's database and its cgroups
        behind (runc's state died with the run's /run tmpfs): both are removed here.
        """
        if self.closed:
            return
        self.closed = True
        try:
            left = self.containers() if (self.workdir / "root").exists() else []
            if left:
                self.podman("rm", "--all", "--force", "--time", "0")
                for cid in left:
                    for cgroup in Path("/sys/fs/cgroup").glob(f"*/libpod_parent/libpod-{cid}"):
                        with contextlib.suppress(OSError):
                            cgroup.rmdir()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)
