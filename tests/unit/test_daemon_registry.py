"""The daemon registry file: round trip, atomic replace, corrupt detection, quarantine."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from dra_driver.daemon_api.values import Endpoints, EntityState, RegisterRequest
from dra_driver.errors import ErrorCode, StateError
from flexnpu_runtime.daemon import registry
from flexnpu_runtime.daemon.model import Entity
from flexnpu_wire.shares import Share

ENTITY = Entity(
    request=RegisterRequest("uid-1", "ns", "n", "ab" * 16, (Share(0, 3, 1 << 30, 30, "fixed"),), "127.0.0.1"),
    state=EntityState.RUNNING,
    endpoints=Endpoints("127.0.0.1", 4242, "/dev/shm/flexnpu/uid-1/aclserver.sock", "/dev/shm/flexnpu/uid-1"),
    pid=1234,
    pid_start_time=99,
    cmdline=("python", "-m", "flexnpu_runtime.aclserver", "--spec", "/x"),
    restarts=1,
    started_at=1.5,
    message="restarted",
)


def test_round_trip_and_mode(tmp_path: Path) -> None:
    path = tmp_path / "state" / registry.FILE_NAME
    registry.Writer(path).save([ENTITY, Entity(ENTITY.request, EntityState.STARTING, Endpoints())])
    loaded = registry.load(path)
    assert loaded[0] == ENTITY
    assert loaded[1].state is EntityState.STARTING
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == [registry.FILE_NAME]  # no temp file left


def test_missing_file_is_empty(tmp_path: Path) -> None:
    assert registry.load(tmp_path / "none.json") == []


def _tamper(path: Path) -> None:
    doc = json.loads(path.read_text())
    doc["entries"][0]["pid"] = 1
    path.write_text(json.dumps(doc))


def _bump_version(path: Path) -> None:
    doc = json.loads(path.read_text())
    doc["version"] = 99
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda p: p.write_text("{not json"), id="not-json"),
        pytest.param(lambda p: p.write_text("[]"), id="not-an-object"),
        pytest.param(lambda p: p.write_bytes(p.read_bytes()[:40]), id="truncated"),
        pytest.param(_tamper, id="checksum-mismatch"),
        pytest.param(_bump_version, id="unknown-version"),
    ],
)
def test_corrupt_file_raises_and_quarantines(tmp_path: Path, damage: object) -> None:
    path = tmp_path / registry.FILE_NAME
    registry.Writer(path).save([ENTITY])
    damage(path)  # type: ignore[operator]
    bad = path.read_bytes()
    with pytest.raises(StateError) as info:
        registry.load(path)
    assert info.value.code is ErrorCode.CHECKPOINT_CORRUPT
    kept = registry.quarantine(path)
    assert not path.exists()
    assert kept.name.startswith("registry.json.corrupt-")
    assert kept.read_bytes() == bad
