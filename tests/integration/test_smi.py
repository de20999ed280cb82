"""flexnpu-smi against a live daemon, and its error exits."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver import smi
from dra_driver.daemon.model import Endpoints, EntityInfo, EntityState, ShareUsage
from tests.integration.daemon_harness import DaemonProc, gone, request, share


@pytest.fixture
def daemon() -> Iterator[DaemonProc]:
    d = DaemonProc()
    try:
        yield d.start()
    finally:
        d.cleanup()


def test_info_and_unregister(daemon: DaemonProc) -> None:
    claim = str(uuid.uuid4())
    with daemon.client() as c:
        res = c.register(request(claim, share(2, vid=0, compute=30), share(5, vid=1, mem_gib=2, compute=100)))

    table = daemon.smi("info")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["ENTITY", "VNPU", "DIE"]
    rows = [line.split() for line in lines[1:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [(claim, "0", "2"), (claim, "1", "5")]
    assert all(str(res.pid) in r and "Running" in r for r in rows)
    assert f"{res.endpoints.tcp_host}:{res.endpoints.tcp_port}" in rows[0]
    assert (
        "0/1024" in rows[0] and "-/30" in rows[0] and "0/2048" in rows[1]
    )  # used/quota; compute use unknown

    doc = json.loads(daemon.smi("info", "--json").stdout)
    [entity] = doc["entities"]
    assert (entity["entity_id"], entity["pid"], entity["state"]) == (claim, res.pid, "Running")
    assert [s["share"]["die_phy_id"] for s in entity["shares"]] == [2, 5]

    out = daemon.smi("unregister", "-u", claim, "--json")
    assert out.returncode == 0 and json.loads(out.stdout) == {"entity_id": claim, "found": True}
    assert gone(res.pid)
    assert daemon.smi("info").stdout.strip() == "no vNPUs registered"


def test_unregister_unknown_id_fails(daemon: DaemonProc) -> None:
    out = daemon.smi("unregister", "-u", "no-such-claim")
    assert out.returncode == smi.EXIT_FAILED
    assert out.stderr == "flexnpu-smi: no vNPU with entity ID 'no-such-claim' is registered\n"
    assert out.stdout == ""


@pytest.mark.parametrize(
    "args", [pytest.param(("info",), id="info"), pytest.param(("unregister", "-u", "x"), id="unregister")]
)
def test_no_daemon_is_a_clear_error(tmp_path: Path, args: tuple[str, ...]) -> None:
    d = DaemonProc()  # never started
    try:
        out = d.smi(*args, socket_path=tmp_path / "nothing.sock")
    finally:
        d.cleanup()
    assert out.returncode == smi.EXIT_UNAVAILABLE
    assert "cannot reach flexnpu-daemon" in out.stderr and "nothing.sock" in out.stderr
    assert out.stdout == ""


def test_info_rows_show_unknown_usage_and_restarts() -> None:
    from dra_driver.daemon.model import Share

    info = EntityInfo(
        entity_id="u1",
        namespace="ns",
        name="n",
        shares=(
            ShareUsage(Share(0, 1, 512 * 1024 * 1024, 0, "elastic", memory_only=True), 256 * 1024 * 1024, -1),
        ),
        pid=0,
        state=EntityState.EXITED,
        endpoints=Endpoints(),
        restarts=1,
    )
    [row] = smi.info_rows([info])
    assert row["MEM(MiB) USED/QUOTA"] == "256/512"
    assert row["COMPUTE(%) USED/QUOTA"] == "-/-"
    assert (row["PID"], row["STATE"], row["ENDPOINT"]) == ("-", "Exited (restarts 1)", "-")
