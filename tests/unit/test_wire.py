"""The wire contracts: dependency-free, the op table agrees with the enum and the server, the
generated C header and JSON are current, and the old import paths are the same objects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flexnpu_wire import emit, framing, ops


def test_wire_and_client_import_nothing_outside_the_standard_library() -> None:
    code = (
        "import sys; import flexnpu_wire.ops, flexnpu_wire.framing, flexnpu_wire.datalink, flexnpu_wire.codes,"
        " flexnpu_wire.clientconf, flexnpu_wire.launch, flexnpu_wire.shares, flexnpu_wire.emit;"
        " import flexnpu_client, flexnpu_client.acl, flexnpu_client.probe;"
        " bad = sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('dra_driver', 'grpc', 'kubernetes', 'numpy', 'opentelemetry', 'google', 'yaml', 'pyroute2'));"
        " print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_every_op_has_exactly_one_row() -> None:
    assert sorted(row.op for row in ops.OPS) == sorted(ops.Op)
    assert len({int(row.op) for row in ops.OPS}) == len(ops.OPS)
    assert {row.op for row in ops.OPS if row.pre_auth} == {ops.Op.PING, ops.Op.HELLO}


def test_server_serves_every_op_of_the_table_with_its_arities(tmp_path: Path) -> None:
    from flexnpu_runtime.aclserver.dispatch import Session

    class _NoBook:
        def device_count(self) -> int:
            return 1

        def release_all(self, *, owner: int | None = None) -> None:
            pass

    class _NoBackend:
        pass

    served = {op for op in ops.Op if op not in (ops.Op.NONE, ops.Op.PING, ops.Op.HELLO)}
    session = Session(_NoBackend(), _NoBook(), shm_dir=str(tmp_path), staging_bytes=4096)  # type: ignore[arg-type]
    try:
        tables = (session._handlers, session._tail_handlers, session._fd_handlers, session._unanswered)
        table = {op: entry[0] for t in tables for op, entry in t.items()}
        assert set(table) == {int(op) for op in served}
        assert sum(len(t) for t in tables) == len(table), "an op is served by one table only"
        for op in served:
            assert table[int(op)] == frozenset(ops.spec_of(op).arities)  # type: ignore[union-attr]
    finally:
        session.close()


@pytest.mark.parametrize("name", ["ops.json", "flexnpu_wire.h"])
def test_generated_files_are_current(name: str) -> None:
    assert (emit.GENERATED / name).read_text() == emit.rendered()[name], "run python -m flexnpu_wire.emit"
    assert emit.main(["--check"]) == 0


def test_json_table_round_trips_the_header_layout() -> None:
    doc = json.loads((emit.GENERATED / "ops.json").read_text())
    assert doc["framing"]["header_bytes"] == framing.HEADER.size == 9
    names = {row["name"]: row["number"] for row in doc["ops"]}
    assert names["MEMCPY"] == 12 and names["GET_USAGE"] == 31
    frame = framing.encode(ops.Op.MALLOC, 7, (4096, 0))
    assert frame[:4] == (len(frame) - 4).to_bytes(4, "big")
    assert frame[4:6] == (10).to_bytes(2, "big")
