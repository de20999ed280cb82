"""Checkpoint: round trip, atomic writes, corruption handling, and the cross-process lock."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from dra_driver import checkpoint
from dra_driver.checkpoint import (
    Checkpoint,
    CheckpointStore,
    ClaimEntry,
    ClaimState,
    DieRecord,
    Effect,
    EffectKind,
)
from dra_driver.claims import PreparedDevice
from dra_driver.devices import DieMode
from dra_driver.errors import ErrorCode, StateError


def _entry(uid: str = "u1") -> ClaimEntry:
    return ClaimEntry(
        uid=uid,
        namespace="ns",
        name="claim",
        state=ClaimState.PREPARE_COMPLETED,
        devices=(PreparedDevice(request_names=("r",), pool="n1", device="npu-0", cdi_device_ids=("a/b=c",)),),
        effects=(Effect(EffectKind.CDI_SPEC, "/var/run/cdi/x.json"),),
        dies=(DieRecord(phy=0, mode=DieMode.WHOLE, device="npu-0"),),
    )


def test_round_trip(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", boot_id="boot-1")
    with store.transaction() as cp:
        cp.claims["u1"] = _entry()
    loaded = store.read()
    assert loaded.claims["u1"].to_json() == _entry().to_json()
    assert (tmp_path / "checkpoint.json").stat().st_mode & 0o777 == 0o600
    assert not list(tmp_path.glob(".checkpoint.json.tmp-*"))


def test_missing_file_reads_empty(tmp_path: Path) -> None:
    cp = CheckpointStore(tmp_path / "checkpoint.json", boot_id="b").read()
    assert cp.claims == {}
    assert not (tmp_path / "checkpoint.json").exists()


def _valid_bytes() -> bytes:
    return checkpoint.encode(Checkpoint(boot_id="b", claims={"u1": _entry()}))


def _future() -> bytes:
    doc = json.loads(_valid_bytes())
    doc["version"] = checkpoint.VERSION + 1
    return json.dumps(doc).encode()


def _edited() -> bytes:
    doc = json.loads(_valid_bytes())
    doc["data"]["claims"]["u1"]["name"] = "other"
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        pytest.param(b"{not json", None, id="not-json"),
        pytest.param(_valid_bytes()[:40], None, id="truncated"),
        pytest.param(b"", None, id="empty-file"),
        pytest.param(b"[]", None, id="not-an-object"),
        pytest.param(_edited(), "checksum", id="checksum-mismatch"),
        pytest.param(_future(), "version", id="future-version"),
        pytest.param(json.dumps({"checksum": "x", "data": {}}).encode(), "version", id="no-version"),
    ],
)
def test_corrupt_checkpoint_is_kept_and_store_starts_empty(
    tmp_path: Path, raw: bytes, field: str | None
) -> None:
    with pytest.raises(StateError) as info:
        checkpoint.decode(raw)
    assert info.value.code == ErrorCode.CHECKPOINT_CORRUPT
    if field:
        assert info.value.field == field

    path = tmp_path / "checkpoint.json"
    path.write_bytes(raw)
    store = CheckpointStore(path, boot_id="b")
    assert store.read().claims == {}
    assert len(store.corrupt_copies) == 1
    assert store.corrupt_copies[0].read_bytes() == raw  # the bad file is kept for inspection
    with store.transaction() as cp:  # and the store keeps working
        cp.claims["u2"] = _entry("u2")
    assert set(store.read().claims) == {"u2"}


def test_transaction_without_change_does_not_write(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", boot_id="b")
    with store.transaction() as cp:
        cp.claims["u1"] = _entry()
    before = (tmp_path / "checkpoint.json").stat().st_mtime_ns
    inode = (tmp_path / "checkpoint.json").stat().st_ino
    with store.transaction():
        pass
    st = (tmp_path / "checkpoint.json").stat()
    assert (st.st_mtime_ns, st.st_ino) == (before, inode)


def _bump(path: str, n: int) -> None:
    store = CheckpointStore(Path(path), boot_id="b")
    for _ in range(n):
        with store.transaction() as cp:
            count = int(cp.boot_id.split("-")[1]) if "-" in cp.boot_id else 0
            cp.boot_id = f"count-{count + 1}"


def test_lock_serialises_processes(tmp_path: Path) -> None:
    """Two processes doing read-modify-write lose no update (the rolling-update case)."""
    path = tmp_path / "checkpoint.json"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_bump, args=(str(path), 25)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert CheckpointStore(path, boot_id="b").read().boot_id == "count-50"
