"""aclserver launch spec: strict parsing names the file and field; render round-trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra_driver import wirefiles
from dra_driver.errors import InvalidInput
from flexnpu_wire import launch
from flexnpu_wire.codes import Policy, Priority

DOC: dict[str, object] = {
    "version": 1,
    "claim_uid": "uid-1",
    "token": "0123456789abcdef",
    "shm_dir": "/dev/shm/flexnpu/uid-1",
    "unix_socket": "/dev/shm/flexnpu/uid-1/aclserver.sock",
    "tcp_host": "127.0.0.1",
    "tcp_port": 0,
    "ledger_dir": "/dev/shm/flexnpu/.ledger",
    "ready_file": "/var/run/flexnpu/aclservers/uid-1.ready",
    "backend": "emulated",
    "max_frame_bytes": 1048576,
    "shares": [
        {
            "virtual_id": 0,
            "die_phy_id": 3,
            "memory_bytes": 1 << 30,
            "compute_percent": 30,
            "policy": "fixed",
            "memory_only": False,
            "priority": "latency-critical",
        },
        {
            "virtual_id": 1,
            "die_phy_id": 4,
            "memory_bytes": 1 << 30,
            "compute_percent": 0,
            "policy": "elastic",
        },
    ],
}


def _with(**changes: object) -> str:
    doc = json.loads(json.dumps(DOC))
    for change, value in changes.items():
        if "__" in change:
            idx, key = change.split("__", 1)
            target = doc["shares"][int(idx[1:])]
        else:
            key, target = change, doc
        if value is KeyError:
            del target[key]
        else:
            target[key] = value
    return json.dumps(doc)


def test_parse_and_round_trip() -> None:
    spec = wirefiles.parse_spec(json.dumps(DOC), source="f")
    assert spec.shares[0].policy is Policy.FIXED and spec.shares[1].memory_only is False
    assert spec.shares[0].priority_enum is Priority.LATENCY_CRITICAL
    assert spec.shares[1].priority_enum is Priority.NORMAL, "a spec without the field: normal"
    assert spec.staging_bytes == launch.DEFAULT_STAGING_BYTES
    assert wirefiles.parse_spec(launch.render_spec(spec), source="f") == spec


@pytest.mark.parametrize(
    ("text", "field"),
    [
        pytest.param(_with(version=2), "version", id="version"),
        pytest.param(_with(token="xyz"), "token", id="token-not-hex"),
        pytest.param(_with(token=KeyError), "token", id="token-missing"),
        pytest.param(_with(shm_dir="rel"), "shm_dir", id="relative-shm"),
        pytest.param(_with(unix_socket="/" + "x" * 120), "unix_socket", id="socket-path-too-long"),
        pytest.param(_with(tcp_port=70000), "tcp_port", id="port-range"),
        pytest.param(_with(tcp_port=True), "tcp_port", id="port-bool"),
        pytest.param(_with(backend="ascend"), "backend", id="unknown-backend"),
        pytest.param(_with(max_frame_bytes=10), "max_frame_bytes", id="tiny-frames"),
        pytest.param(_with(colour="red"), "colour", id="unknown-field"),
        pytest.param(_with(shares=[]), "shares", id="no-shares"),
        pytest.param(_with(s0__policy="greedy"), "shares[0].policy", id="bad-policy"),
        pytest.param(_with(s0__priority="urgent"), "shares[0].priority", id="bad-priority"),
        pytest.param(_with(s0__priority=1), "shares[0].priority", id="priority-not-a-string"),
        pytest.param(_with(s0__compute_percent=101), "shares[0].compute_percent", id="compute-range"),
        pytest.param(_with(s0__memory_bytes=0), "shares[0].memory_bytes", id="memory-zero"),
        pytest.param(_with(s0__memory_only=1), "shares[0].memory_only", id="memory-only-int"),
        pytest.param(_with(s1__virtual_id=0), "shares", id="duplicate-virtual-id"),
        pytest.param(_with(s1__extra=1), "shares[1].extra", id="unknown-share-field"),
    ],
)
def test_bad_fields(text: str, field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        wirefiles.parse_spec(text, source="/run/x.spec.json")
    assert err.value.field == field
    assert "/run/x.spec.json" in str(err.value)


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="cannot read aclserver spec"):
        wirefiles.load_spec(tmp_path / "absent.json")


def test_ready_file_written_atomically(tmp_path: Path) -> None:
    path = str(tmp_path / "r.ready")
    info = launch.ReadyInfo(pid=1, tcp_host="127.0.0.1", tcp_port=5, unix_socket="/s", started_at=1.5)
    wirefiles.write_ready(path, info)
    assert wirefiles.load_ready(path) == info
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.ready"]
