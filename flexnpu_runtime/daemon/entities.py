"""The registered claims in memory, their per-claim locks, and the one writer of the registry file.

Locking: one lock per claim (:meth:`Entities.claim`) serialises register, unregister and restart
of that claim and is held while its process starts or stops; one short lock guards the map and
the registry file (:meth:`Entities.locked`). Every change goes through here and is saved at once
(``registry.Writer`` re-encodes only the entry that changed).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from dra_driver.daemon_api.values import EntityState
from flexnpu_runtime.daemon import processes, registry
from flexnpu_runtime.daemon.model import Entity

__all__ = ["Claim", "Entities"]


@dataclass(slots=True)
class Claim:
    """A claim's lock, and the process this daemon launched for it (None for an adopted one)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    launched: processes.Launched | None = None


class Entities:
    """Thread-safe map claim UID → :class:`Entity`, saved to ``registry_file`` on every change."""

    def __init__(self, registry_file: Path) -> None:
        self._writer = registry.Writer(registry_file)
        self._entities: dict[str, Entity] = {}
        self._claims: dict[str, Claim] = {}
        self._lock = threading.Lock()

    @contextmanager
    def locked(self) -> Iterator[dict[str, Entity]]:
        """The map itself, for a check-and-change that must be atomic; call :meth:`save` in it."""
        with self._lock:
            yield self._entities

    def save(self, *, sync: bool = True) -> None:
        """Write the registry (the caller holds :meth:`locked`)."""
        self._writer.save(self._entities.values(), sync=sync)

    def get(self, claim_uid: str) -> Entity | None:
        with self._lock:
            return self._entities.get(claim_uid)

    def snapshot(self) -> list[Entity]:
        with self._lock:
            return sorted(self._entities.values(), key=lambda e: e.claim_uid)

    def count(self) -> int:
        with self._lock:
            return len(self._entities)

    def running(self) -> list[tuple[Entity, Claim]]:
        """Every entity in state Running, with its claim record."""
        with self._lock:
            return [
                (e, self._claims.setdefault(e.claim_uid, Claim()))  # adopted entities have none yet
                for e in self._entities.values()
                if e.state is EntityState.RUNNING
            ]

    def put(self, entity: Entity, *, sync: bool = True) -> None:
        with self._lock:
            self._entities[entity.claim_uid] = entity
            self.save(sync=sync)

    def replace(self, expected: Entity, new: Entity) -> bool:
        """Put ``new`` only if the claim's entity is still ``expected``; whether it was."""
        with self._lock:
            if self._entities.get(expected.claim_uid) != expected:
                return False
            self._entities[new.claim_uid] = new
            self.save()
            return True

    def update_if_present(self, entity: Entity) -> None:
        """Put ``entity`` unless its claim was unregistered meanwhile."""
        with self._lock:
            if entity.claim_uid in self._entities:
                self._entities[entity.claim_uid] = entity
                self.save()

    def drop(self, claim_uid: str, claim: Claim) -> None:
        with self._lock:
            self._entities.pop(claim_uid, None)
            claim.launched = None
            self.save()

    def reset(self, entities: dict[str, Entity]) -> None:
        """Replace every entry (recovery at start) and save."""
        with self._lock:
            self._entities = dict(entities)
            self.save()

    @contextmanager
    def claim(self, claim_uid: str) -> Iterator[Claim]:
        """Hold ``claim_uid``'s lock."""
        with self._lock:
            claim = self._claims.setdefault(claim_uid, Claim())
        with claim.lock:
            yield claim
