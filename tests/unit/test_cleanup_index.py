"""The reconciler decides whether a claim event matters from memory, not from the checkpoint.

A foreign claim's event costs a ``stat`` of the store file and two dict lookups; the store is read
again only after its file changed (this node prepared or removed something, in this process or in
another one during a rolling update).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from controller.cleanup import ClaimIndex, Reconciler
from dra_driver import cdi, sweep
from dra_driver.checkpoint import ClaimState

DRIVER, POOL = "npu.flexnpu.io", "node-a"


class _Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.claims: dict[str, Any] = {}
        self.reads = 0
        path.write_text("v1")
        _age(path)

    def read(self) -> SimpleNamespace:
        self.reads += 1
        return SimpleNamespace(claims=dict(self.claims))

    def write(self, uid: str, namespace: str, name: str) -> None:
        self.claims[uid] = SimpleNamespace(
            uid=uid, namespace=namespace, name=name, state=ClaimState.PREPARE_COMPLETED
        )
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"v{len(self.claims) + 1}")
        os.replace(tmp, self.path)  # an atomic write: a new inode
        _age(self.path)


def _age(path: Path, seconds: float = 1.0) -> None:
    """As if the file had been written ``seconds`` ago (the index distrusts very recent changes)."""
    old = time.time_ns() - int(seconds * 1e9)
    os.utime(path, ns=(old, old))


def _event(
    uid: str, namespace: str, name: str, *, node: str = "node-x", consumers: int = 1
) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "namespace": namespace, "name": name},
        "status": {
            "allocation": {"devices": {"results": [{"driver": DRIVER, "pool": node, "device": "d"}]}},
            "reservedFor": [{"uid": f"p{i}"} for i in range(consumers)],
        },
    }


@pytest.fixture
def rec(tmp_path: Path) -> Reconciler:
    store = _Store(tmp_path / "checkpoint.json")
    owner = SimpleNamespace(store=store)
    places = sweep.SweepPlaces(
        tmp_path / "cdi", cdi.Kind.parse("flexnpu.io/vnpu"), tmp_path / "run", tmp_path / "shm"
    )
    return Reconciler(
        kube=None, preparer=owner, driver_name=DRIVER, node_name=POOL, pool_name=POOL, places=places
    )  # type: ignore[arg-type]


def test_foreign_events_never_read_the_store(rec: Reconciler) -> None:
    store = rec.preparer.store
    assert isinstance(store, _Store)
    store.write("mine", "ns", "c1")
    rec.index.refresh(force=True)
    reads = store.reads
    for i in range(1000):
        assert not rec.event_matters("MODIFIED", _event(f"u{i}", "other", f"f{i}"))
    assert store.reads == reads


def test_own_claim_events_and_a_changed_store(rec: Reconciler) -> None:
    store = rec.preparer.store
    assert isinstance(store, _Store)
    rec.index.refresh(force=True)
    assert not rec.event_matters("DELETED", _event("u1", "ns", "c1"))  # not prepared here (yet)
    store.write("u1", "ns", "c1")  # prepared meanwhile: the file changed, the index follows
    assert rec.event_matters("DELETED", _event("u1", "ns", "c1", node=POOL))
    assert rec.event_matters("ADDED", _event("u2", "ns", "c1", node=POOL))  # same name, new UID
    assert rec.event_matters("MODIFIED", _event("u1", "ns", "c1", node=POOL, consumers=0))  # pod gone
    assert not rec.event_matters("MODIFIED", _event("u1", "ns", "c1", node=POOL))  # our own status write
    assert rec.event_matters("MODIFIED", _event("u1", "ns", "c1", node="node-b"))  # allocated elsewhere


def test_index_reloads_only_when_the_file_changed(tmp_path: Path) -> None:
    store = _Store(tmp_path / "checkpoint.json")
    index = ClaimIndex(lambda: store.read().claims, store.path)
    index.refresh()
    index.refresh()
    assert index.reloads == 1
    store.write("u1", "ns", "c1")
    index.refresh()
    assert index.reloads == 2 and index.uid_of("ns", "c1") == "u1" and len(index) == 1


def test_a_change_within_a_timestamp_tick_is_read_again(tmp_path: Path) -> None:
    """Two writes in one mtime tick look alike: a fresh file is not trusted for the next event."""
    store = _Store(tmp_path / "checkpoint.json")
    index = ClaimIndex(lambda: store.read().claims, store.path)
    store.path.write_text("fresh")  # changed just now, in place
    index.refresh()
    index.refresh()
    assert index.reloads == 2
    _age(store.path)
    index.refresh()
    index.refresh()
    assert index.reloads == 3
