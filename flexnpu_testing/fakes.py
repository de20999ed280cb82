"""In-memory fakes of the preparer's collaborators: the checkpoint store, the daemon, the status writer.

They implement the same interfaces as ``dra_driver.checkpoint.CheckpointStore``,
``dra_driver.daemon_api.client.DaemonClient`` and ``controller.status.StatusWriter``, with switches
that make one call fail, so unit tests can make any recorded step of a prepare or unprepare raise
and check what is left (``tests/unit/test_prepare.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.checkpoint import Checkpoint, ClaimEntry, ClaimLocks, Mutation
from dra_driver.daemon_api.values import (
    Endpoints,
    EntityInfo,
    EntityState,
    RegisterRequest,
    RegisterResult,
    ShareUsage,
)
from dra_driver.errors import ErrorCode, StateError, Unavailable
from dra_kubeletplugin.claims import ClaimRef

__all__ = ["FakeDaemon", "FakeStatus", "FakeStore"]


@dataclass
class FakeStore:
    """The CheckpointStore interface, in memory; ``fail_at`` makes the n-th recorded step (1-based) raise."""

    directory: Path
    claims: dict[str, ClaimEntry] = field(default_factory=dict)
    boot_id: str = "boot"
    updates: int = 0
    fail_at: int = 0
    error: Exception = field(default_factory=lambda: StateError("disk full", code=ErrorCode.INTERNAL))

    def __post_init__(self) -> None:
        self.claim_locks = ClaimLocks(self.directory / "locks")

    def update(self, uid: str, mutate: Mutation) -> ClaimEntry | None:
        new = mutate(dict(self.claims))
        if new == self.claims.get(uid):
            return new  # as the real store: nothing changed, nothing recorded
        self.updates += 1
        if self.updates == self.fail_at:
            raise self.error
        if new is None:
            self.claims.pop(uid, None)
        else:
            self.claims[uid] = new
        return new

    def entries(self) -> dict[str, ClaimEntry]:
        return dict(self.claims)

    def get(self, uid: str) -> ClaimEntry | None:
        return self.claims.get(uid)

    def read(self) -> Checkpoint:
        return Checkpoint(self.boot_id, dict(self.claims))

    @contextlib.contextmanager
    def locked(self) -> Iterator[Checkpoint]:
        yield self.read()


@dataclass
class FakeDaemon:
    shm_root: Path
    registered: dict[str, RegisterRequest] = field(default_factory=dict)
    fail_register: Exception | None = None
    fail_unregister: Exception | None = None
    fail_uids: set[str] = field(default_factory=set)
    unregistered: list[str] = field(default_factory=list)

    def register(self, request: RegisterRequest) -> RegisterResult:
        if self.fail_register is not None:
            raise self.fail_register
        self.registered[request.claim_uid] = request
        shm = self.shm_root / request.claim_uid
        shm.mkdir(parents=True, exist_ok=True)
        return RegisterResult(
            entity_id=request.claim_uid,
            pid=4242,
            endpoints=Endpoints(
                tcp_host="127.0.0.1",
                tcp_port=0 if request.unix_only else 40000,  # as the daemon: no TCP listener asked, none
                unix_socket=str(shm / "aclserver.sock"),
                shm_dir=str(shm),
            ),
        )

    def list(self) -> list[EntityInfo]:
        return [
            EntityInfo(
                entity_id=uid,
                namespace=req.namespace,
                name=req.name,
                shares=tuple(ShareUsage(sh) for sh in req.shares),
                pid=4242,
                state=EntityState.RUNNING,
                endpoints=self.register(req).endpoints,
            )
            for uid, req in self.registered.items()
        ]

    def unregister(self, claim_uid: str) -> bool:
        self.unregistered.append(claim_uid)
        if self.fail_unregister is not None:
            raise self.fail_unregister
        if claim_uid in self.fail_uids:
            raise Unavailable("daemon cannot stop this one")
        return self.registered.pop(claim_uid, None) is not None


@dataclass
class FakeStatus:
    written: dict[str, list[Mapping[str, Any]]] = field(default_factory=dict)
    fail: Exception | None = None

    def write(self, ref: ClaimRef, devices: Sequence[Mapping[str, Any]]) -> None:
        if self.fail is not None:
            raise self.fail
        self.written[ref.uid] = list(devices)
