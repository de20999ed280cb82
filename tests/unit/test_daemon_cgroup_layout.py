"""The pure side of the aclservers' cgroups: the hierarchies a host mounts, what a claim's cgroup gets, bounds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flexnpu_runtime.daemon import bounds, cgroup_layout, cgroups
from flexnpu_runtime.daemon.cgroup_layout import Figures, Version
from flexnpu_wire.shares import Share

MIB = 1024 * 1024

V2 = """\
25 1 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
"""
HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
IN_A_CONTAINER = """\
900 800 0:29 / /host/sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
901 800 0:36 / /host/sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
902 800 0:40 /kubepods/pod1/c1 /sys/fs/cgroup/memory ro,relatime - cgroup cgroup rw,memory
"""


@pytest.mark.parametrize(
    ("text", "root", "version", "keys"),
    [
        pytest.param(V2, "/sys/fs/cgroup", Version.V2, [""], id="v2"),
        pytest.param(
            HYBRID,
            "/sys/fs/cgroup",
            Version.V1,
            ["cpu,cpuacct", "devices", "memory", "pids", "name=systemd", ""],
            id="v1-hybrid",
        ),
        pytest.param(
            IN_A_CONTAINER, "/host/sys/fs/cgroup", Version.V1, ["memory", "pids"], id="host-fs-in-a-container"
        ),
        pytest.param(
            IN_A_CONTAINER, "/host/sys/fs/cgroup/", Version.V1, ["memory", "pids"], id="trailing-slash"
        ),
    ],
)
def test_parse_mountinfo_finds_the_hierarchies_at_the_root(
    text: str, root: str, version: Version, keys: list[str]
) -> None:
    layout = cgroup_layout.parse_mountinfo(text, root)
    assert layout is not None and layout.version is version
    assert sorted(h.key for h in layout.hierarchies) == sorted(keys)


@pytest.mark.parametrize(
    ("text", "root"),
    [
        pytest.param("", "/sys/fs/cgroup", id="nothing-mounted"),
        pytest.param(HYBRID, "/tmp/elsewhere", id="another-root"),
        pytest.param("garbage line\n", "/sys/fs/cgroup", id="garbage"),
    ],
)
def test_parse_mountinfo_without_cgroups_is_none(text: str, root: str) -> None:
    assert cgroup_layout.parse_mountinfo(text, root) is None


def test_mount_points_are_unescaped() -> None:
    text = r"41 31 0:38 / /srv/cg\040root rw - cgroup2 cgroup2 rw" + "\n"
    layout = cgroup_layout.parse_mountinfo(text, "/srv/cg root")
    assert layout is not None and layout.hierarchies[0].mount == "/srv/cg root"


def test_the_carrying_hierarchy_of_a_controller() -> None:
    v1 = cgroup_layout.parse_mountinfo(HYBRID, "/sys/fs/cgroup")
    v2 = cgroup_layout.parse_mountinfo(V2, "/sys/fs/cgroup")
    assert v1 is not None and v2 is not None
    assert (h := v1.carrying("cpu")) is not None and h.mount == "/sys/fs/cgroup/cpu,cpuacct"
    assert v1.carrying("cpuset") is None
    assert v2.carrying("memory") is v2.hierarchies[0]


@pytest.mark.parametrize(
    ("own", "parent", "inside"),
    [
        pytest.param({"memory": "/", "pids": "/"}, "flexnpu.slice", False, id="host-root"),
        pytest.param({"memory": "/kubepods/pod1/c1"}, "flexnpu.slice", False, id="container-elsewhere"),
        pytest.param({"memory": "/flexnpu.slice"}, "flexnpu.slice", True, id="the-parent-is-our-own"),
        pytest.param({"pids": "/kubepods"}, "kubepods/flexnpu", True, id="the-parent-below-our-own"),
        pytest.param({"pids": "/kube"}, "kubepods/flexnpu", False, id="a-prefix-is-not-a-parent"),
    ],
)
def test_a_parent_inside_the_daemons_own_cgroup_is_refused(
    own: dict[str, str], parent: str, inside: bool
) -> None:
    layout = cgroup_layout.parse_mountinfo(IN_A_CONTAINER, "/host/sys/fs/cgroup")
    assert layout is not None
    assert (cgroup_layout.inside_own(layout, parent, own) is not None) is inside


@pytest.mark.parametrize(
    ("parent", "ok"),
    [
        pytest.param("flexnpu.slice", True, id="default"),
        pytest.param("a/b_c-1", True, id="nested"),
        pytest.param("../escape", False, id="dotdot"),
        pytest.param("/abs", False, id="absolute"),
        pytest.param("a//b", False, id="empty-part"),
        pytest.param("a/./b", False, id="dot"),
        pytest.param("sp ace", False, id="space"),
        pytest.param("", False, id="empty"),
    ],
)
def test_check_parent(parent: str, ok: bool) -> None:
    assert (cgroup_layout.check_parent(parent) is None) is ok


BOUNDS = bounds.Bounds(memory_bytes=400 * MIB, tasks=1216, cpu_weight=30)


def test_limit_writes_v2() -> None:
    layout = cgroup_layout.parse_mountinfo(V2, "/sys/fs/cgroup")
    assert layout is not None
    writes = {(w.file, w.value, w.required) for w in cgroup_layout.limit_writes(layout, BOUNDS)}
    assert writes == {
        ("memory.max", str(400 * MIB), True),
        ("memory.swap.max", "0", False),
        ("memory.oom.group", "1", False),
        ("pids.max", "1216", True),
        ("cpu.weight", "30", True),
    }


def test_limit_writes_v1_go_to_the_hierarchy_of_each_controller() -> None:
    layout = cgroup_layout.parse_mountinfo(HYBRID, "/sys/fs/cgroup")
    assert layout is not None
    writes = [
        (w.hierarchy.key, w.file, w.value, w.required) for w in cgroup_layout.limit_writes(layout, BOUNDS)
    ]
    assert writes == [
        ("memory", "memory.limit_in_bytes", str(400 * MIB), True),
        ("memory", "memory.memsw.limit_in_bytes", str(400 * MIB), False),  # no swap beyond memory
        ("pids", "pids.max", "1216", True),
        ("cpu,cpuacct", "cpu.shares", "307", True),
    ]


@pytest.mark.parametrize(
    ("text", "raw", "want"),
    [
        pytest.param(
            V2,
            {
                "memory_current": "1048576\n",
                "memory_max": "max\n",
                "memory_peak": "2097152\n",
                "tasks_current": "7\n",
                "tasks_max": "1216\n",
                "cpu_weight": "30\n",
                "oom_kills": "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n",
            },
            Figures(MIB, -1, 2 * MIB, 7, 1216, 30, 2),
            id="v2",
        ),
        pytest.param(
            HYBRID,
            {
                "memory_current": "1048576",
                "memory_max": "9223372036854771712",
                "oom_kills": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
                "cpu_weight": "307",
            },
            Figures(memory_current=MIB, memory_max=-1, cpu_weight=30, oom_kills=1),
            id="v1-no-limit-and-shares",
        ),
        pytest.param(V2, {"oom_kills": "no such key 4\n", "tasks_max": "max"}, Figures(), id="unknown"),
    ],
)
def test_parse_figures(text: str, raw: dict[str, str], want: Figures) -> None:
    layout = cgroup_layout.parse_mountinfo(text, "/sys/fs/cgroup")
    assert layout is not None
    assert cgroup_layout.parse_figures(layout, raw) == want


def test_figure_files_name_each_versions_files() -> None:
    v2 = cgroup_layout.parse_mountinfo(V2, "/sys/fs/cgroup")
    v1 = cgroup_layout.parse_mountinfo(HYBRID, "/sys/fs/cgroup")
    assert v1 is not None and v2 is not None
    assert {k: f for k, (_, f) in cgroup_layout.figure_files(v2).items()}["oom_kills"] == "memory.events"
    assert {k: f for k, (_, f) in cgroup_layout.figure_files(v1).items()}["oom_kills"] == "memory.oom_control"


def share(memory_mib: int, compute: int, *, host_mib: int = 0, memory_only: bool = False) -> Share:
    return Share(
        0, 0, memory_mib * MIB, compute, "fixed", memory_only=memory_only, host_memory_bytes=host_mib * MIB
    )


@pytest.mark.parametrize(
    ("shares", "memory_mib", "weight"),
    [
        pytest.param(
            [share(128, 30)], 128 + 128 + 16 * 8 + 128, 30, id="one-share-hostMemory-defaults-to-quota"
        ),
        pytest.param([share(1024, 20, host_mib=64)], 1024 + 64 + 128 + 128, 20, id="own-hostMemory"),
        pytest.param(
            [share(128, 60), share(256, 70)], 128 * 2 + 256 * 2 + 128 + 128, 130, id="two-vnpus-add-up"
        ),
        pytest.param([share(128, 1)], 128 * 2 + 128 + 128, bounds.MIN_CPU_WEIGHT, id="weight-floor"),
        pytest.param(
            [share(128, 0, memory_only=True)], 128 * 2 + 128 + 128, 100, id="memory-only-default-weight"
        ),
    ],
)
def test_bounds_for(shares: list[Share], memory_mib: int, weight: int) -> None:
    b = bounds.bounds_for(
        shares, max_sessions=16, staging_bytes=8 * MIB, overhead_bytes=bounds.DEFAULT_MEMORY_OVERHEAD_BYTES
    )
    assert b.memory_bytes == memory_mib * MIB and b.cpu_weight == weight
    assert b.tasks == bounds.BASE_TASKS + 16 * (1 + bounds.WAITERS_PER_SESSION + len(shares))
    assert b.cpu_shares == max(2, weight * 1024 // 100)


def test_the_join_check_says_when_a_moved_process_did_not_arrive(tmp_path: Path) -> None:
    """A "hierarchy" that takes the write but is no cgroup (a plain directory): the real child
    process never arrives, so the daemon runs aclservers unbounded and says why instead of failing
    every register."""
    layout = cgroup_layout.Layout(
        root=str(tmp_path),
        version=Version.V1,
        hierarchies=(
            cgroup_layout.Hierarchy(
                mount=str(tmp_path / "memory"), root="/", controllers=frozenset({"memory"})
            ),
        ),
    )
    parent = tmp_path / "memory" / "flexnpu.slice"
    (parent / "probe-1").mkdir(parents=True)  # an earlier daemon's, empty
    ours = parent / f"probe-{os.getpid()}"
    ours.mkdir()
    (ours / "cgroup.procs").write_text("")  # takes the write, as a cgroup would
    problem = cgroups.check_join(cgroups.Cgroups(layout, "flexnpu.slice"))
    assert "did not arrive there (hierarchies memory)" in problem
    assert (ours / "cgroup.procs").read_text().isdigit(), "the child's PID was written"
    assert not (parent / "probe-1").exists(), "an earlier daemon's empty probe is removed"


def test_the_join_check_names_the_cgroup_it_cannot_make(tmp_path: Path) -> None:
    layout = cgroup_layout.Layout(
        root=str(tmp_path),
        version=Version.V1,
        hierarchies=(
            cgroup_layout.Hierarchy(mount=str(tmp_path / "gone"), root="/", controllers=frozenset({"pids"})),
        ),
    )
    problem = cgroups.check_join(cgroups.Cgroups(layout, "flexnpu.slice"))
    assert problem.startswith(f"cannot move a process into the cgroup {tmp_path}/gone/flexnpu.slice/probe-")


@pytest.mark.parametrize(("vnpus", "tasks"), [(1, 64 + 16 * 66), (2, 64 + 16 * 67), (16, 64 + 16 * 81)])
def test_the_task_bound_grows_with_the_claims_vnpus(vnpus: int, tasks: int) -> None:
    """Issue 25 class 10: every session of a 16-vNPU claim may run 81 tasks (its thread, 64 waiters,
    a kernel worker per vNPU); a fixed 72 per session stopped the 16th session."""
    shares = [share(128, 1) for _ in range(vnpus)]
    b = bounds.bounds_for(shares, max_sessions=16, staging_bytes=8 * MIB, overhead_bytes=0)
    assert b.tasks == tasks


def test_the_waiters_per_session_are_the_aclservers() -> None:
    from flexnpu_runtime.aclserver import server

    assert bounds.WAITERS_PER_SESSION == server._MAX_WAITERS


@pytest.mark.parametrize(
    ("text", "hits"),
    [("max 3\n", 3), ("max 0\n", 0), ("", -1), ("max lots\n", -1)],
)
def test_task_bound_refusals_are_read_from_pids_events(text: str, hits: int) -> None:
    for text_of_mounts in (V2, HYBRID):
        layout = cgroup_layout.parse_mountinfo(text_of_mounts, "/sys/fs/cgroup")
        assert layout is not None
        assert {k: f for k, (_, f) in cgroup_layout.figure_files(layout).items()}[
            "task_limit_hits"
        ] == "pids.events"
        assert cgroup_layout.parse_figures(layout, {"task_limit_hits": text}).task_limit_hits == hits
