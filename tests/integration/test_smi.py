"""flexnpu-smi where only the daemon runs (its container: no checkpoint, no API), and its pure rows.

The node-side behaviour (claims, pods, residuals, cleanup, unregister of a prepared claim) is in
test_smi_node.py; this file covers the daemon's view: one row per vNPU by virtual id, orphan
aclservers stopped by ``unregister``, and clear exits when the daemon is not there.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from dra_driver.checkpoint import ClaimState
from dra_driver.daemon_api.values import LEDGER_DIR_NAME, Endpoints, EntityInfo, EntityState, ShareUsage
from dra_driver.devices import DieMode
from dra_driver.records import DieRecord
from flexnpu_runtime.aclserver import ledger
from flexnpu_runtime.daemon import bounds
from flexnpu_wire.codes import Priority
from flexnpu_wire.shares import Share
from kubeletplugin import smi, smi_tables
from tests.integration.daemon_harness import DaemonProc, gone, request, share

MIB = 1024 * 1024


@pytest.fixture
def daemon() -> Iterator[DaemonProc]:
    d = DaemonProc()
    try:
        yield d.start()
    finally:
        d.cleanup()


POLICY_LINE = (
    "placement policy: binpack (devices listed most-used die first: shares fill a die before the next)"
)
"""The last line of ``flexnpu-smi info``: the node's placement policy (the default, binpack)."""


def test_info_shows_each_vnpu_and_unregister_stops_an_orphan(daemon: DaemonProc) -> None:
    claim = str(uuid.uuid4())
    with daemon.client() as c:
        online = dataclasses.replace(share(5, vid=1, mem_gib=2, compute=100), priority="latency-critical")
        res = c.register(request(claim, share(2, vid=0, compute=30), online))

    table = daemon.smi("info")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["CLAIM", "UID", "CLAIM", "VNPU"]
    rows = json.loads(daemon.smi("info", "--json").stdout)["rows"]
    assert [(r["CLAIM UID"], r["VNPU"], r["DIE"]) for r in rows] == [(claim, "0", "2"), (claim, "1", "5")]
    assert all(r["ACLSERVER"] == f"{res.pid} Running" for r in rows)
    # the priority went daemon API -> launch spec -> the aclserver's die-ledger entry, and smi shows it
    assert [r["PRIORITY"] for r in rows] == ["normal", "latency-critical"]
    (entry,) = ledger.read_entries(str(daemon.shm_root / LEDGER_DIR_NAME), 5)
    assert (entry.pid, entry.priority) == (res.pid, Priority.LATENCY_CRITICAL)
    assert rows[0]["ENDPOINT"] == f"{res.endpoints.tcp_host}:{res.endpoints.tcp_port}"
    assert (rows[0]["MEM(MiB) USED/QUOTA"], rows[0]["COMPUTE(%) USED/QUOTA"]) == (
        "0/1024",
        "0/30",
    )  # probed: idle
    assert rows[1]["MEM(MiB) USED/QUOTA"] == "0/2048"
    assert all(r["RESIDUAL"].startswith("yes: orphan aclserver") for r in rows)  # no checkpoint owns it
    # The aclserver's own cgroup: its host memory within its bound (both quotas, staging, overhead),
    # its tasks, its CPU weight from the claim's compute quota (30 % + 100 %).
    want = bounds.bounds_for(
        [share(2, compute=30), share(5, vid=1, mem_gib=2, compute=100)],
        max_sessions=16,
        staging_bytes=8 * MIB,
        overhead_bytes=bounds.DEFAULT_MEMORY_OVERHEAD_BYTES,
    )
    used, limit = rows[0]["HOST MEM(MiB) USED/MAX"].split("/")
    assert int(used) > 0 and int(limit) == want.memory_bytes // MIB
    assert rows[0]["TASKS USED/MAX"].endswith(f"/{want.tasks}") and rows[0]["CPU WEIGHT"] == "130"

    out = daemon.smi("unregister", "-u", claim, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"uid": claim, "unprepared": False, "aclserverStopped": True}
    assert gone(res.pid)
    # nothing prepared, then the node's placement policy (issue 27: info names it)
    assert daemon.smi("info").stdout.strip().splitlines() == ["nothing prepared on this node", POLICY_LINE]


def test_unregister_unknown_id_fails(daemon: DaemonProc) -> None:
    out = daemon.smi("unregister", "-u", "no-such-claim")
    assert out.returncode == smi.EXIT_FAILED
    assert "flexnpu-smi: no claim or vNPU with ID 'no-such-claim' on this node" in out.stderr
    assert out.stdout == ""


@pytest.mark.parametrize(
    ("args", "stdout"),
    [
        pytest.param(("info",), f"nothing prepared on this node\n{POLICY_LINE}\n", id="info"),
        pytest.param(("unregister", "-u", "x"), "", id="unregister"),
    ],
)
def test_no_daemon_is_a_clear_error(tmp_path: Path, args: tuple[str, ...], stdout: str) -> None:
    d = DaemonProc()  # never started
    try:
        out = d.smi(*args, socket_path=tmp_path / "nothing.sock")
    finally:
        d.cleanup()
    assert out.returncode == smi.EXIT_UNAVAILABLE
    assert "cannot reach flexnpu-daemon" in out.stderr and "nothing.sock" in out.stderr
    assert out.stdout == stdout


def _entity(
    uid: str, *usages: ShareUsage, restarts: int = 0, state: EntityState = EntityState.RUNNING
) -> EntityInfo:
    return EntityInfo(
        entity_id=uid,
        namespace="ns",
        name="n",
        shares=usages,
        pid=0 if state is EntityState.EXITED else 42,
        state=state,
        endpoints=Endpoints(),
        restarts=restarts,
    )


def test_rows_show_unknown_usage_and_restarts() -> None:
    info = _entity(
        "u1",
        ShareUsage(Share(0, 1, 512 * MIB, 0, "elastic", memory_only=True), 256 * MIB, -1),
        restarts=1,
        state=EntityState.EXITED,
    )
    [row] = smi_tables.info_rows({}, {"u1": info}, lambda e: ("-", "-"))
    assert row["MEM(MiB) USED/QUOTA"] == "256/512"
    assert row["COMPUTE(%) USED/QUOTA"] == "-/-"
    assert (row["ACLSERVER"], row["ENDPOINT"]) == ("- Exited (restarts 1)", "-")


def test_two_vnpus_of_one_claim_on_one_die_show_their_own_usage() -> None:
    """Usage is keyed by virtual id, not by die: two shares of one die are two rows with two figures."""
    entry = SimpleNamespace(
        uid="u1",
        namespace="ns",
        name="c",
        state=ClaimState.PREPARE_COMPLETED,
        dies=[
            DieRecord(phy=3, mode=DieMode.SOFT, device="vnpu-3", policy="fixed"),
            DieRecord(phy=3, mode=DieMode.SOFT, device="vnpu-3", policy="fixed"),
        ],
    )
    info = _entity(
        "u1",
        ShareUsage(Share(1, 3, 256 * MIB, 20, "fixed"), 100 * MIB, 7),
        ShareUsage(Share(0, 3, 128 * MIB, 10, "fixed"), 5 * MIB, 3),
    )
    rows = smi_tables.info_rows({"u1": entry}, {"u1": info}, lambda e: ("pods/p", "no"))  # type: ignore[dict-item]
    assert [(r["VNPU"], r["MEM(MiB) USED/QUOTA"], r["COMPUTE(%) USED/QUOTA"]) for r in rows] == [
        ("0", "5/128", "3/10"),
        ("1", "100/256", "7/20"),
    ]
    assert all(r["RESIDUAL"] == "no" and r["PODS"] == "pods/p" for r in rows)


def _bounded(state: EntityState, **figures: int) -> EntityInfo:
    return dataclasses.replace(_entity("u1", state=state), cgroup="flexnpu.slice/aclserver-u1", **figures)


@pytest.mark.parametrize(
    ("ent", "cells"),
    [
        pytest.param(None, ("-", "-", "-"), id="no-aclserver"),
        pytest.param(_entity("u1"), ("unbounded", "unbounded", "unbounded"), id="in-the-daemon's-cgroup"),
        pytest.param(
            _bounded(
                EntityState.RUNNING,
                memory_current_bytes=40 * MIB,
                memory_max_bytes=408 * MIB,
                tasks_current=5,
                tasks_max=1216,
                cpu_weight=30,
            ),
            ("40/408", "5/1216", "30"),
            id="own-cgroup",
        ),
        pytest.param(_bounded(EntityState.RUNNING), ("-/max", "-/max", "-"), id="figures-unknown"),
    ],
)
def test_bounds_cells(ent: EntityInfo | None, cells: tuple[str, str, str]) -> None:
    got = smi_tables.bounds_cells(ent)
    assert (got["HOST MEM(MiB) USED/MAX"], got["TASKS USED/MAX"], got["CPU WEIGHT"]) == cells


@pytest.mark.parametrize(
    ("ent", "daemon_known", "state"),
    [
        pytest.param(_entity("u1"), True, "PrepareCompleted", id="serving"),
        pytest.param(_entity("u1", state=EntityState.EXITED), True, "AclserverDown (Exited)", id="down"),
        pytest.param(None, True, "AclserverMissing", id="unknown-to-the-daemon"),
        pytest.param(None, False, "PrepareCompleted", id="daemon-unreachable-says-nothing"),
    ],
)
def test_state_cell_says_when_the_aclserver_is_not_serving(
    ent: EntityInfo | None, daemon_known: bool, state: str
) -> None:
    entry = SimpleNamespace(state=ClaimState.PREPARE_COMPLETED)
    assert smi_tables.state_cell(entry, ent, shares=True, daemon_known=daemon_known) == state  # type: ignore[arg-type]


def test_oom_kills_are_shown_with_the_aclserver() -> None:
    ent = dataclasses.replace(_entity("u1", restarts=1, state=EntityState.EXITED), oom_kills=2)
    assert smi_tables.aclserver_cell(ent) == "- Exited (restarts 1, OOM kills 2)"
