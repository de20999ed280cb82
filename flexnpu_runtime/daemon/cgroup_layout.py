"""Pure: the host's cgroup hierarchies, where a claim's aclserver cgroup lives, and what is written there.

The daemon is told a cgroup root (``--cgroup-root``, default ``/sys/fs/cgroup``; the chart mounts
the host's at ``/host/sys/fs/cgroup``). :func:`parse_mountinfo` reads ``/proc/self/mountinfo``'s
text and finds what is mounted there:

* **v2** — the root itself is a ``cgroup2`` mount: one hierarchy with every controller;
* **v1** — the root holds ``cgroup`` mounts (``memory``, ``pids``, ``cpu,cpuacct``, ``name=systemd``,
  …), each a hierarchy of its own; a ``cgroup2`` mount beside them (``unified``, a hybrid host) is
  one more hierarchy to move the process in, with no controller we use.

Every claim gets ``<parent>/aclserver-<claim uid>`` (``--cgroup-parent``, default
``flexnpu.slice``) in **every** hierarchy: the container runtime finds a container's processes
through its cgroups (runc's v1 manager through the ``devices`` and ``freezer`` ones), so an
aclserver left in any of the daemon container's cgroups would be frozen and killed with it.
:func:`limit_writes` says which files get which values for given :class:`~bounds.Bounds`;
:func:`parse_figures` reads them back. Nothing here touches the world.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from flexnpu_runtime.daemon.bounds import Bounds

__all__ = [
    "CGROUP_PREFIX",
    "DEFAULT_PARENT",
    "Figures",
    "Hierarchy",
    "Layout",
    "Version",
    "Write",
    "check_parent",
    "claim_dir_name",
    "inside_own",
    "limit_writes",
    "parse_figures",
    "parse_mountinfo",
    "parse_proc_cgroup",
]

DEFAULT_PARENT = "flexnpu.slice"
CGROUP_PREFIX = "aclserver-"
_PARENT_RE = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
_UNLIMITED = -1


class Version(StrEnum):
    V2 = "v2"
    V1 = "v1"


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """One mounted cgroup hierarchy under the root."""

    mount: str
    """Its mount point (absolute)."""
    root: str
    """The cgroup its mount shows at the mount point (mountinfo's fourth field; ``/`` for a whole hierarchy)."""
    controllers: frozenset[str]
    """v1: the controllers it carries; v2: empty here (``cgroup.controllers`` says, read at run time)."""
    name: str = ""
    """v1 named hierarchy (``systemd`` for ``name=systemd``)."""
    unified: bool = False

    @property
    def key(self) -> str:
        """How ``/proc/<pid>/cgroup`` names this hierarchy (its second field)."""
        if self.unified:
            return ""
        if self.name:
            return f"name={self.name}"
        return ",".join(sorted(self.controllers))


@dataclass(frozen=True, slots=True)
class Layout:
    root: str
    version: Version
    hierarchies: tuple[Hierarchy, ...]

    def carrying(self, controller: str) -> Hierarchy | None:
        """The hierarchy a controller is used in (v2: the one hierarchy)."""
        if self.version is Version.V2:
            return self.hierarchies[0]
        return next((h for h in self.hierarchies if controller in h.controllers), None)

    def describe(self) -> str:
        if self.version is Version.V2:
            return f"cgroup v2 at {self.root}"
        names = ", ".join(h.key or "unified" for h in self.hierarchies)
        return f"cgroup v1 at {self.root} ({names})"


@dataclass(frozen=True, slots=True)
class Write:
    """Write ``value`` to ``file`` of the claim's cgroup in ``hierarchy``; ``required``: a failure is an error."""

    hierarchy: Hierarchy
    file: str
    value: str
    required: bool = True


@dataclass(frozen=True, slots=True)
class Figures:
    """What a claim's cgroup reports; -1 when unknown or unlimited."""

    memory_current: int = _UNLIMITED
    memory_max: int = _UNLIMITED
    memory_peak: int = _UNLIMITED
    tasks_current: int = _UNLIMITED
    tasks_max: int = _UNLIMITED
    cpu_weight: int = _UNLIMITED
    oom_kills: int = _UNLIMITED
    task_limit_hits: int = _UNLIMITED
    """How often a fork or thread start was refused at ``pids.max`` (``pids.events`` ``max``)."""


def check_parent(parent: str) -> str | None:
    """Why ``parent`` is not a usable relative cgroup path (None when it is)."""
    if not _PARENT_RE.match(parent) or any(p in (".", "..") for p in parent.split("/")):
        return "must be a relative path of [A-Za-z0-9_.-] names (no '.', '..' or empty parts)"
    return None


def claim_dir_name(claim_uid: str) -> str:
    """The claim's cgroup directory name (the UID was validated as a safe file name)."""
    return CGROUP_PREFIX + claim_uid


def parse_mountinfo(text: str, root: str) -> Layout | None:
    """The cgroup hierarchies mounted at or directly under ``root``; None when there are none."""
    root = posixpath.normpath(root)
    at_root: Hierarchy | None = None
    below: dict[str, Hierarchy] = {}
    for line in text.splitlines():
        parts = line.split()
        if " - " not in line or len(parts) < 10:
            continue
        sep = parts.index("-")
        fstype, options = parts[sep + 1], parts[sep + 3] if len(parts) > sep + 3 else ""
        if fstype not in ("cgroup", "cgroup2"):
            continue
        point, mroot = _unescape(parts[4]), _unescape(parts[3])
        if fstype == "cgroup2" and point == root:
            at_root = Hierarchy(mount=point, root=mroot, controllers=frozenset(), unified=True)
        elif posixpath.dirname(point) == root:
            if fstype == "cgroup2":
                below[point] = Hierarchy(mount=point, root=mroot, controllers=frozenset(), unified=True)
            else:
                opts = options.split(",")
                name = next((o[5:] for o in opts if o.startswith("name=")), "")
                ctrls = frozenset(o for o in opts if o not in _V1_OPTIONS and not o.startswith("name="))
                below[point] = Hierarchy(mount=point, root=mroot, controllers=ctrls, name=name)
    if at_root is not None:
        return Layout(root=root, version=Version.V2, hierarchies=(at_root,))
    if not below:
        return None
    return Layout(root=root, version=Version.V1, hierarchies=tuple(below[k] for k in sorted(below)))


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup``: hierarchy key (see :attr:`Hierarchy.key`) → the process's cgroup path."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out[parts[1]] = parts[2]
    return out


def inside_own(layout: Layout, parent: str, own: Mapping[str, str]) -> str | None:
    """A hierarchy whose ``parent`` lies inside the daemon's own cgroup (so an aclserver there would
    die with the daemon's container), as a sentence; None when every one is outside."""
    for h in layout.hierarchies:
        mine = own.get(h.key)
        if not mine or mine == "/":
            continue
        where = posixpath.normpath(posixpath.join(h.root, parent))
        if where == mine or where.startswith(mine.rstrip("/") + "/"):
            return f"{h.mount}/{parent} is inside the daemon's own cgroup {mine}"
    return None


def limit_writes(layout: Layout, bounds: Bounds) -> tuple[Write, ...]:
    """What to write into a claim's cgroup, in order, for ``bounds``."""
    out: list[Write] = []
    mem, pids, cpu = layout.carrying("memory"), layout.carrying("pids"), layout.carrying("cpu")
    if layout.version is Version.V2:
        h = layout.hierarchies[0]
        out += [
            Write(h, "memory.max", str(bounds.memory_bytes)),
            Write(h, "memory.swap.max", "0", required=False),  # absent without swap accounting
            Write(h, "memory.oom.group", "1", required=False),
            Write(h, "pids.max", str(bounds.tasks)),
            Write(h, "cpu.weight", str(bounds.cpu_weight)),
        ]
        return tuple(out)
    if mem is not None:
        out.append(Write(mem, "memory.limit_in_bytes", str(bounds.memory_bytes)))
        # memory+swap no larger than memory: no swap (absent when swap accounting is off)
        out.append(Write(mem, "memory.memsw.limit_in_bytes", str(bounds.memory_bytes), required=False))
    if pids is not None:
        out.append(Write(pids, "pids.max", str(bounds.tasks)))
    if cpu is not None:
        out.append(Write(cpu, "cpu.shares", str(bounds.cpu_shares)))
    return tuple(out)


def figure_files(layout: Layout) -> dict[str, tuple[Hierarchy, str]]:
    """Figure name → (hierarchy, file) to read for :func:`parse_figures`."""
    mem, pids, cpu = layout.carrying("memory"), layout.carrying("pids"), layout.carrying("cpu")
    if layout.version is Version.V2:
        h = layout.hierarchies[0]
        names = {
            "memory_current": "memory.current",
            "memory_max": "memory.max",
            "memory_peak": "memory.peak",
            "tasks_current": "pids.current",
            "tasks_max": "pids.max",
            "cpu_weight": "cpu.weight",
            "oom_kills": "memory.events",
            "task_limit_hits": "pids.events",
        }
        return {k: (h, f) for k, f in names.items()}
    out: dict[str, tuple[Hierarchy, str]] = {}
    if mem is not None:
        out |= {
            "memory_current": (mem, "memory.usage_in_bytes"),
            "memory_max": (mem, "memory.limit_in_bytes"),
            "memory_peak": (mem, "memory.max_usage_in_bytes"),
            "oom_kills": (mem, "memory.oom_control"),
        }
    if pids is not None:
        out |= {
            "tasks_current": (pids, "pids.current"),
            "tasks_max": (pids, "pids.max"),
            "task_limit_hits": (pids, "pids.events"),
        }
    if cpu is not None:
        out["cpu_weight"] = (cpu, "cpu.shares")
    return out


def parse_figures(layout: Layout, raw: Mapping[str, str]) -> Figures:
    """:class:`Figures` from the texts of :func:`figure_files` (missing or odd texts read as -1)."""
    values: dict[str, int] = {}
    for key, text in raw.items():
        if key == "oom_kills":
            values[key] = _keyed(text, "oom_kill")
        elif key == "task_limit_hits":
            values[key] = _keyed(text, "max")
        elif key == "cpu_weight" and layout.version is Version.V1:
            shares = _number(text)
            values[key] = (shares * 100 + 512) // 1024 if shares > 0 else _UNLIMITED
        else:
            values[key] = _number(text)
    if layout.version is Version.V1 and values.get("memory_max", 0) >= _V1_NO_LIMIT:
        values["memory_max"] = _UNLIMITED
    return Figures(**values)


_V1_OPTIONS = frozenset({"rw", "ro", "relatime", "noatime", "nosuid", "nodev", "noexec", "clone_children"})
_V1_NO_LIMIT = 1 << 62  # v1 reports "no limit" as a page-rounded LONG_MAX


def _number(text: str) -> int:
    text = text.strip()
    return int(text) if text.isdigit() else _UNLIMITED


def _keyed(text: str, key: str) -> int:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return _UNLIMITED


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space, …)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
