"""Checkpoint: per-claim records, the version-1 migration, damaged records, coherence, the lock."""

from __future__ import annotations

import json
import multiprocessing
from dataclasses import replace
from pathlib import Path

import pytest

from dra_driver import checkpoint, files
from dra_driver.checkpoint import (
    Checkpoint,
    CheckpointStore,
    CheckpointUntrusted,
    ClaimEntry,
    ClaimState,
    DieRecord,
    Effect,
    EffectKind,
)
from dra_driver.checkpoint import format as checkpoint_format
from dra_driver.devices import DieMode
from dra_driver.errors import ErrorCode, StateError, Unavailable
from dra_kubeletplugin.claims import PreparedDevice


def check_trusted(store: CheckpointStore) -> None:
    """Raise :class:`CheckpointUntrusted` unless every record could be read (what a destructive path
    asks of ``store.doubts()``)."""
    why = store.doubts()
    if why:
        raise CheckpointUntrusted(
            "the checkpoint cannot be trusted, so nothing is removed until an operator runs "
            f"flexnpu-smi adopt or discard: {'; '.join(why)}"[:1500],
            field="checkpoint",
        )


def _entry(uid: str = "u1", name: str = "claim") -> ClaimEntry:
    return ClaimEntry(
        uid=uid,
        namespace="ns",
        name=name,
        state=ClaimState.PREPARE_COMPLETED,
        devices=(PreparedDevice(request_names=("r",), pool="n1", device="npu-0", cdi_device_ids=("a/b=c",)),),
        effects=(Effect(EffectKind.CDI_SPEC, "/var/run/cdi/x.json"),),
        dies=(DieRecord(phy=0, mode=DieMode.WHOLE, device="npu-0"),),
    )


def _put(store: CheckpointStore, entry: ClaimEntry) -> None:
    store.update(entry.uid, lambda _: entry)


def _same(a: ClaimEntry | None, b: ClaimEntry) -> bool:
    return a is not None and replace(a, updated_at=0.0) == b


def test_round_trip_one_file_per_claim(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", boot_id="boot-1")
    _put(store, _entry("u1"))
    _put(store, _entry("u2"))
    assert _same(CheckpointStore(tmp_path / "checkpoint.json").get("u1"), _entry("u1"))
    d = tmp_path / "checkpoint.json"
    assert d.is_dir() and d.stat().st_mode & 0o777 == 0o700
    assert sorted(p.name for p in d.iterdir()) == ["u1.json", "u2.json"]
    assert (d / "u1.json").stat().st_mode & 0o777 == 0o600
    store.update("u1", lambda _: None)
    assert sorted(p.name for p in d.iterdir()) == ["u2.json"]
    assert set(CheckpointStore(d).entries()) == {"u2"}


def test_missing_checkpoint_reads_empty_and_trusted(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", boot_id="b")
    assert store.read().claims == {} and store.trusted
    assert not (tmp_path / "checkpoint.json").exists()


def test_a_step_writes_only_its_claim(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", boot_id="b")
    for i in range(20):
        _put(store, _entry(f"u{i}"))
    before = {p.name: p.stat().st_ino for p in (tmp_path / "checkpoint.json").iterdir()}
    _put(store, replace(_entry("u7"), state=ClaimState.UNPREPARE_STARTED))
    after = {p.name: p.stat().st_ino for p in (tmp_path / "checkpoint.json").iterdir()}
    assert {n for n in before if before[n] != after[n]} == {"u7.json"}


# -- version 1: decode, migration ------------------------------------------------------------------


def _v1_bytes(claims: dict[str, ClaimEntry] | None = None) -> bytes:
    return checkpoint.encode(
        Checkpoint(boot_id="b", claims=claims if claims is not None else {"u1": _entry()})
    )


def _future() -> bytes:
    doc = json.loads(_v1_bytes())
    doc["version"] = checkpoint.VERSION + 1
    return json.dumps(doc).encode()


def _edited() -> bytes:
    doc = json.loads(_v1_bytes())
    doc["data"]["claims"]["u1"]["name"] = "other"
    return json.dumps(doc).encode()


def _wrong_shape() -> bytes:
    data = {"bootID": "b", "claims": {"u1": {"uid": "u1", "dies": "not-a-list"}}}
    return json.dumps({"version": 1, "checksum": checkpoint._checksum(data), "data": data}).encode()


BAD_V1 = [
    pytest.param(b"{not json", None, id="not-json"),
    pytest.param(_v1_bytes()[:40], None, id="truncated"),
    pytest.param(b"", None, id="empty-file"),
    pytest.param(b"[]", None, id="not-an-object"),
    pytest.param(_edited(), "checksum", id="checksum-mismatch"),
    pytest.param(_future(), "version", id="future-version"),
    pytest.param(json.dumps({"checksum": "x", "data": {}}).encode(), "version", id="no-version"),
    pytest.param(_wrong_shape(), "data.claims", id="valid-checksum-wrong-shape"),
]


@pytest.mark.parametrize(("raw", "field"), BAD_V1)
def test_bad_version_1_file_is_kept_and_the_store_is_untrusted(
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
    assert not store.trusted  # damaged state is never "nothing prepared"
    with pytest.raises(CheckpointUntrusted) as untrusted:
        check_trusted(store)
    assert untrusted.value.code == ErrorCode.CHECKPOINT_UNTRUSTED
    (copy,) = store.corrupt_copies
    assert copy.read_bytes() == raw  # the bad file is kept for inspection
    assert not CheckpointStore(path, boot_id="b").trusted  # and the doubt survives a restart
    _put(store, _entry("u2"))  # the store keeps working for new claims
    assert set(store.entries()) == {"u2"}
    store.trust(discard=True)
    assert store.trusted and CheckpointStore(path).trusted


def test_version_1_file_is_migrated_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    raw = _v1_bytes({"u1": _entry("u1"), "u2": _entry("u2", name="other")})
    path.write_bytes(raw)
    store = CheckpointStore(path, boot_id="now")
    got = store.read()
    assert got.boot_id == "b" and set(got.claims) == {"u1", "u2"}
    assert got.claims["u2"] == _entry("u2", name="other")
    assert path.is_dir() and (tmp_path / "checkpoint.json.v1").read_bytes() == raw
    assert store.trusted
    assert set(CheckpointStore(path).entries()) == {"u1", "u2"}  # a restart reads the new format


def test_migration_interrupted_between_its_renames_is_redone(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    (tmp_path / "checkpoint.json.v1").write_bytes(_v1_bytes({"u1": _entry("u1")}))
    (tmp_path / ".checkpoint.json.migrating-12345").mkdir()  # the crash left its temp dir
    store = CheckpointStore(path, boot_id="b")
    assert set(store.entries()) == {"u1"} and store.trusted
    assert not list(tmp_path.glob(".checkpoint.json.migrating-*"))


def test_version_1_reader_fails_loudly_on_the_new_directory(tmp_path: Path) -> None:
    """What the previous release does with it (``path.read_bytes()``): an error, not 'empty'."""
    path = tmp_path / "checkpoint.json"
    _put(CheckpointStore(path, boot_id="b"), _entry())
    with pytest.raises(IsADirectoryError):
        path.read_bytes()


# -- damaged version-2 records ---------------------------------------------------------------------


def _record(entry: ClaimEntry) -> bytes:
    return checkpoint.encode_record(entry)


def _record_future(entry: ClaimEntry) -> bytes:
    doc = json.loads(_record(entry))
    doc["version"] = checkpoint.VERSION + 1
    return json.dumps(doc).encode()


def _record_wrong_shape(entry: ClaimEntry) -> bytes:
    body = {**entry.to_json(), "effects": [{"kind": "no-such-effect", "ref": "x"}]}
    return json.dumps({"version": 2, "checksum": checkpoint._checksum(body), "entry": body}).encode()


def _record_other_uid(entry: ClaimEntry) -> bytes:
    return _record(replace(entry, uid="someone-else"))


BAD_RECORDS = [
    pytest.param(lambda e: _record(e)[: len(_record(e)) // 2], id="truncated"),
    pytest.param(lambda e: b"\x00\xff garbage", id="corrupt"),
    pytest.param(_record_future, id="newer-version"),
    pytest.param(_record_wrong_shape, id="valid-checksum-wrong-shape"),
    pytest.param(_record_other_uid, id="names-another-claim"),
]


@pytest.mark.parametrize("spoil", BAD_RECORDS)
def test_damaged_record_makes_the_store_untrusted_and_keeps_it(tmp_path: Path, spoil: object) -> None:
    path = tmp_path / "checkpoint.json"
    store = CheckpointStore(path, boot_id="b")
    _put(store, _entry("u1"))
    _put(store, _entry("u2"))
    raw = spoil(_entry("u1"))  # type: ignore[operator]
    (path / "u1.json").write_bytes(raw)

    fresh = CheckpointStore(path, boot_id="b")
    assert set(fresh.entries()) == {"u2"}  # the other claims still read
    assert not fresh.trusted and "u1.json" in fresh.damaged()
    with pytest.raises(CheckpointUntrusted) as info:  # the damaged claim is neither re-prepared nor dropped
        fresh.update("u1", lambda _: None)
    assert info.value.claim_uid == "u1"
    _put(fresh, _entry("u3"))  # others are served
    assert (path / "u1.json").read_bytes() == raw  # kept in place

    (kept,) = fresh.trust(discard=True)
    assert kept.read_bytes() == raw and fresh.trusted and set(fresh.entries()) == {"u2", "u3"}


def test_a_symlink_in_the_checkpoint_is_not_followed(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    _put(CheckpointStore(path, boot_id="b"), _entry("u1"))
    target = tmp_path / "elsewhere.json"
    target.write_bytes(_record(_entry("u9")))
    (path / "u9.json").symlink_to(target)
    store = CheckpointStore(path, boot_id="b")
    assert set(store.entries()) == {"u1"} and not store.trusted


# -- coherence across processes, the lock -----------------------------------------------------------


def test_another_store_sees_each_write_and_an_own_write_decodes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "checkpoint.json"
    a, b = CheckpointStore(path, boot_id="b"), CheckpointStore(path, boot_id="b")
    _put(a, _entry("u1"))
    assert set(b.entries()) == {"u1"}
    _put(b, _entry("u2"))
    a_view = a.entries()
    assert set(a_view) == {"u1", "u2"}

    decoded: list[str] = []
    real = checkpoint.decode_record

    def counting(raw: bytes, *, source: str) -> ClaimEntry:
        decoded.append(source)
        return real(raw, source=source)

    monkeypatch.setattr(checkpoint_format, "decode_record", counting)
    for i in range(10):
        _put(a, _entry(f"x{i}"))
        a.entries()
    assert decoded == []  # the hot path decodes nothing
    b.entries()
    assert len(decoded) == 12  # b saw a change and read the directory once


def test_locked_without_change_does_not_write(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", boot_id="b")
    _put(store, _entry("u1"))
    rec = tmp_path / "checkpoint.json" / "u1.json"
    before = (rec.stat().st_mtime_ns, rec.stat().st_ino)
    with store.locked():
        pass
    assert (rec.stat().st_mtime_ns, rec.stat().st_ino) == before


def _bump(path: str, n: int) -> None:
    store = CheckpointStore(Path(path), boot_id="b")
    for _ in range(n):
        with store.locked() as cp:
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


def test_lock_timeout_is_a_clear_error(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", boot_id="b", lock_timeout=0.05)
    store.entries()
    with files.locked(store.lock_path, timeout=1), pytest.raises(Unavailable) as info:
        store.update("u1", lambda _: _entry())  # flock excludes another open file, even in-process
    assert "checkpoint lock" in str(info.value) and info.value.code == ErrorCode.DEVICE_BUSY
    assert store.entries() == {}
