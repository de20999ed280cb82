"""The node's look at its shares' aclservers: their state in each claim's Ready condition, and healing.

Every pass (``ACLSERVER_PERIOD``) lists the daemon's aclservers once and, for each claim this node
prepared with a daemon registration:

* mirrors the aclserver's state into the claim's Ready condition (``AclserverDown`` while it is
  not running; ``AclserverRestarted`` when it serves again as another process, since a new
  aclserver holds none of the tenant's device memory);
* **heals** a claim whose aclserver is gone for good — the daemon no longer knows it (its pod was
  deleted on a node where aclservers cannot outlive it), or it stayed Exited over two looks (the
  daemon's restart budget is spent, e.g. after OOM kills): the share is registered again from the
  checkpoint record (``Preparer.heal``: same token, quota and endpoints, so ``client.conf`` stays
  valid and the tenant's next ``aclInit`` works). Heals of one claim back off (2 s doubling to
  5 min, reset once it has served for 10 min), so an aclserver that keeps dying is not restarted
  in a loop.

A daemon that does not answer changes nothing: doubt keeps things.

:class:`AclserverPass` is the node's loop around it: each pass says (log and a Node Event, once a
change) when the daemon cannot bound a share's shm dir (:class:`ShmReport`), emits
``claims_changed`` (what the reconciler or ``flexnpu-smi`` changed in the checkpoint: the publisher
republishes when a die's share policy changed), then looks once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.checkpoint import CheckpointStore, EffectKind
from dra_driver.daemon_api.client import DaemonClient
from dra_driver.daemon_api.values import EntityInfo, EntityState
from dra_driver.errors import FlexNPUError
from dra_driver.logs import ClaimLogger, claim_logger
from kubeletplugin.effects import Daemon
from kubeletplugin.events import NodeEvents
from kubeletplugin.prepare import Preparer

__all__ = ["ACLSERVER_PERIOD", "RESTARTED", "AclserverPass", "AclserverWatch", "ShmReport"]

log = logging.getLogger("flexnpu.node")

ACLSERVER_PERIOD = 2.0
"""Seconds between two looks at the daemon's aclservers."""
RESTARTED = "AclserverRestarted"
DOWN = "AclserverDown"
FIRST_BACKOFF, MAX_BACKOFF, STABLE_SECONDS = 2.0, 300.0, 600.0
LOST = "the share's device memory was lost, as after a device reset"


@dataclass(slots=True)
class _Seen:
    ready: bool = True
    pid: int = 0
    exited_pid: int = 0  # Exited with this pid at the previous look
    heals: int = 0
    next_heal: float = 0.0
    serving_since: float = 0.0


class AclserverWatch:
    """One :meth:`look` per pass; keeps what it saw of each claim between passes."""

    def __init__(
        self,
        *,
        preparer: Preparer,
        daemon: Daemon,
        store: CheckpointStore,
        get_claim: Callable[[str, str], Mapping[str, Any]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.preparer = preparer
        self.daemon = daemon
        self.store = store
        self.get_claim = get_claim  # the API's claim, only if its old TCP port was taken meanwhile
        self.clock = clock
        self._seen: dict[str, _Seen] = {}

    def look(self) -> float:
        """List the aclservers once; heal and mirror each prepared share claim. Seconds to the next look."""
        # The checkpoint first: a claim completed after the daemon's answer must not be judged by it
        # (its aclserver would look missing); one completed before it is in the answer unless gone.
        prepared = {
            uid: entry
            for uid, entry in self.store.read().claims.items()
            if entry.state == "PrepareCompleted" and entry.effect(EffectKind.DAEMON_REGISTRATION)
        }
        try:
            states = {e.entity_id: e for e in self.daemon.list()}
        except FlexNPUError as err:
            log.debug("daemon list failed: %s", err)
            return ACLSERVER_PERIOD
        for uid in set(self._seen) - set(prepared):
            del self._seen[uid]
        for uid, entry in prepared.items():
            rec = entry.registration
            seen = self._seen.setdefault(uid, _Seen(pid=(rec.pid or 0) if rec is not None else 0))
            self._one(uid, entry.namespace, entry.name, states.get(uid), seen)
        return ACLSERVER_PERIOD

    def _one(self, uid: str, namespace: str, name: str, ent: EntityInfo | None, seen: _Seen) -> None:
        clog = claim_logger(uid, namespace, name, base=log)
        now = self.clock()
        running = ent is not None and ent.state is EntityState.RUNNING
        pid = ent.pid if ent is not None else 0
        if not running and self._gone_for_good(ent, seen) and now >= seen.next_heal:
            why = "unknown to the daemon" if ent is None else f"{ent.state}: {ent.message}"
            healed = self._heal(uid, clog, why)
            if healed is not None:
                seen.heals += 1
                seen.next_heal = now + min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** (seen.heals - 1))
                running, pid = True, healed
        seen.exited_pid = pid if not running and ent is not None and ent.state is EntityState.EXITED else 0
        if running:
            if seen.serving_since and now - seen.serving_since >= STABLE_SECONDS:
                seen.heals = 0  # it served long enough: a next heal is immediate again
            if seen.ready and pid == seen.pid:
                return
            if seen.pid and pid != seen.pid:
                reason, message = RESTARTED, f"aclserver serving again as pid {pid} (was {seen.pid}); {LOST}"
            else:
                reason, message = "Prepared", f"aclserver pid {pid} serving again"
            if self.preparer.set_ready(uid, True, reason, message):
                clog.warning("claim Ready again: %s", message)
                seen.ready, seen.pid, seen.serving_since = True, pid, now
            return
        if seen.ready:
            message = "the claim's aclserver is " + (
                f"{ent.state}: {ent.message}" if ent is not None else "missing"
            )
            if self.preparer.set_ready(uid, False, DOWN, message):
                seen.ready = False
                clog.warning("%s", message)

    def _heal(self, uid: str, clog: ClaimLogger, why: str) -> int | None:
        """Register the claim's share again; the new aclserver's pid, or None."""
        try:
            result = self.preparer.heal(uid, clog, get_claim=self.get_claim)
        except FlexNPUError as err:
            clog.warning("could not register the share again (%s): %s", why, err)
            return None
        if result is None:
            return None
        clog.warning("aclserver gone for good (%s): registered the share again, pid %d", why, result.pid)
        return result.pid

    @staticmethod
    def _gone_for_good(ent: EntityInfo | None, seen: _Seen) -> bool:
        """The daemon does not know the claim, or it stayed Exited with the same pid since the last look."""
        if ent is None:
            return True
        return ent.state is EntityState.EXITED and ent.pid == seen.exited_pid


class ShmReport:
    """Says, in the log and a Node Event, when the daemon cannot bound a share's shm dir (once a change)."""

    def __init__(self, *, daemon: DaemonClient, create_event: Callable[..., object], node_name: str) -> None:
        self.daemon = daemon
        self.create_event = create_event  # controller.kube.Kube.create_event
        self.node_name = node_name
        self._problem = ""  # what the daemon last said

    def check(self) -> None:
        try:
            problem = self.daemon.health().shm_problem
        except FlexNPUError:
            return
        if problem and problem != self._problem:
            log.error("flexnpu-daemon refuses every new share on this node: %s", problem)
            try:
                self.create_event(
                    involved={
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self.node_name,
                        "namespace": "default",
                    },
                    reason="FlexNPUShmUnbounded",
                    message=f"shares are refused on this node: {problem}",
                    event_type="Warning",
                    host=self.node_name,
                )
            except FlexNPUError as err:
                log.info("could not post the FlexNPUShmUnbounded event: %s", err)
        self._problem = problem


class AclserverPass:
    """One :meth:`iteration` per ``ACLSERVER_PERIOD``: the shm report, ``claims_changed``, one look.

    Builds its :class:`AclserverWatch` and :class:`ShmReport` from the node's parts: ``get_claim``
    and ``create_event`` are the node's API client's (``controller.kube.Kube``)."""

    def __init__(
        self,
        *,
        preparer: Preparer,
        daemon: DaemonClient,
        store: CheckpointStore,
        events: NodeEvents,
        get_claim: Callable[[str, str], Mapping[str, Any]],
        create_event: Callable[..., object],
        node_name: str,
    ) -> None:
        self.watch = AclserverWatch(preparer=preparer, daemon=daemon, store=store, get_claim=get_claim)
        self.shm = ShmReport(daemon=daemon, create_event=create_event, node_name=node_name)
        self.events = events

    def iteration(self) -> float:
        self.shm.check()
        self.events.claims_changed.emit()
        return self.watch.look()
