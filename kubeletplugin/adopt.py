"""Rebuild ownership from evidence when the checkpoint cannot be trusted (``flexnpu-smi adopt``).

A checkpoint record that cannot be read leaves the store *untrusted* (``dra_driver/checkpoint/store.py``)
and every destructive path stops. This module ends the doubt one of two ways, each an explicit,
logged operator decision:

* :func:`adopt` — for every claim UID the node holds evidence of (a CDI spec of this driver's
  kind, a ``client.conf`` directory, an aclserver in the daemon's registry, a vNPU in the
  driver's vNPU ledger, a damaged record) and that the API says is allocated on this node by
  this driver, record a ``PrepareCompleted`` entry rebuilt from that evidence: the plan from the
  API's allocation, the token from the claim's ``client.conf``, the endpoints from the daemon,
  each template device's vNPU from the ledger and the live vNPU list
  (:func:`kubeletplugin.hardsplit.adopted_vnpus`). A claim whose evidence does not explain every
  effect its allocation needs (a template device without a vNPU of its own) is not recorded: it
  is left to the sweep, which never destroys a vNPU the ledger does not tie to a gone claim.
  Evidence no allocated claim explains is left unowned, so the next reconcile pass removes it.
  Damaged records are kept aside.
* :func:`discard` — trust what could be read; damaged records are set aside and what only they
  owned becomes an orphan for the sweep.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dra_driver import cdi, logs, paths, render, wirefiles
from dra_driver.checkpoint import ClaimEntry, ClaimState, Effect, EffectKind, Registration, StatusRecord
from dra_driver.daemon_api.values import EntityInfo, RegisterResult
from dra_driver.errors import FlexNPUError
from dra_driver.plan import plan_claim, resolve_shares
from dra_driver.vnpu import ownership
from dra_kubeletplugin.claims import ClaimRef
from kubeletplugin import hardsplit
from kubeletplugin.effects import Job
from kubeletplugin.prepare import Preparer

log = logging.getLogger("flexnpu.adopt")

ClaimLister = Callable[[], Iterable[Mapping[str, Any]]]


@dataclass(frozen=True, slots=True)
class Outcome:
    adopted: tuple[str, ...]  # claim UIDs recorded again
    unexplained: tuple[str, ...]  # evidence no allocated claim explains: left for the sweep
    kept: tuple[Path, ...]  # damaged records, set aside for inspection


def evidence(preparer: Preparer) -> dict[str, set[str]]:
    """Claim UID -> what the node holds for it (``cdi-spec``, ``client-conf``, ``aclserver``, ``vnpu``,
    ``record``)."""
    s = preparer.settings
    found: dict[str, set[str]] = {}
    for uid in cdi.list_specs(s.cdi_dir, s.cdi_kind):
        found.setdefault(uid, set()).add("cdi-spec")
    conf_root = s.run_dir / "claims"
    for d in sorted(conf_root.iterdir()) if conf_root.is_dir() else []:
        if d.is_dir() and not d.is_symlink():
            found.setdefault(d.name, set()).add("client-conf")
    for ent in _entities(preparer).values():
        found.setdefault(ent.entity_id, set()).add("aclserver")
    if preparer.hard is not None:
        for uid in (ownership.load(preparer.hard.state_dir) or {}).values():
            found.setdefault(uid, set()).add("vnpu")
    for name in preparer.store.damaged():
        found.setdefault(name.removesuffix(".json"), set()).add("record")
    return found


def adopt(preparer: Preparer, list_claims: ClaimLister) -> Outcome:
    """Record every claim the evidence and the API agree on; end the doubt. Raises if the API is down."""
    s = preparer.settings
    ours: dict[str, Mapping[str, Any]] = {}
    for claim in list_claims():  # a failure here raises: without the API nothing is decided
        meta = claim.get("metadata") or {}
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
            "results"
        ) or []
        if any(r.get("driver") == s.driver_name and r.get("pool") == s.pool_name for r in results):
            ours[str(meta.get("uid"))] = claim
    known = preparer.store.entries()
    entities = _entities(preparer)
    entries: dict[str, ClaimEntry] = {}
    unexplained: list[str] = []
    for uid, kinds in sorted(evidence(preparer).items()):
        if uid in known:
            continue
        found = ours.get(uid)
        if found is None:
            log.warning(
                "claim %s: %s on the node, but no claim allocated here has this UID", uid, sorted(kinds)
            )
            unexplained.append(uid)
            continue
        try:
            entries[uid] = _rebuild(preparer, found, entities.get(uid))
        except FlexNPUError as err:
            log.warning("claim %s: cannot rebuild its entry (%s); left for the sweep", uid, err)
            unexplained.append(uid)
    kept = preparer.store.trust(discard=False, entries=entries)
    for uid, entry in entries.items():
        logs.claim_logger(uid, entry.namespace, entry.name).warning(
            "adopted from evidence: %s", ", ".join(str(e.kind) for e in entry.effects)
        )
    log.warning("checkpoint trusted again after adopt: %d adopted, %d kept aside", len(entries), len(kept))
    return Outcome(adopted=tuple(entries), unexplained=tuple(unexplained), kept=tuple(kept))


def discard(preparer: Preparer) -> Outcome:
    """Trust what could be read; set the damaged records aside (their effects become orphans)."""
    kept = preparer.store.trust(discard=True)
    log.warning("checkpoint trusted again after discard: %d damaged record(s) set aside: %s", len(kept), kept)
    return Outcome(adopted=(), unexplained=(), kept=tuple(kept))


def _rebuild(preparer: Preparer, claim: Mapping[str, Any], ent: EntityInfo | None) -> ClaimEntry:
    s = preparer.settings
    meta = claim.get("metadata") or {}
    ref = ClaimRef(str(meta.get("namespace")), str(meta.get("uid")), str(meta.get("name")))
    base = plan_claim(
        claim, ref=ref, driver_name=s.driver_name, pool_name=s.pool_name, inventory=preparer.inventory()
    )
    plan = resolve_shares(base)
    if plan.hard_results():
        h = preparer.effects.hard_vnpus(ref.uid)
        plan = hardsplit.adopted_vnpus(plan, h.manager, h.state_dir, inventory=preparer.inventory())
    conf = s.layout.conf_dir(ref.uid) / "client.conf"
    token = wirefiles.load_client_conf(conf).token if conf.is_file() else secrets.token_hex(32)
    job = Job(plan=plan, token=token, layout=s.layout)
    if ent is not None:
        job.registration = RegisterResult(ent.entity_id, ent.pid, ent.endpoints, existing=True)
    for path in (s.layout.conf_dir(ref.uid), s.layout.spec_path(ref.uid)):  # the UID is the API's
        paths.contained(path, claim_uid=ref.uid)
    effects = list(render.planned(plan, layout=s.layout, token=token))
    if ent is not None:
        rec = Registration(token, plan.shares, ent.endpoints, ent.pid)
        effects = [
            replace(e, details=rec) if e.kind == EffectKind.DAEMON_REGISTRATION else e for e in effects
        ]
    r = job.rendered
    effects.append(Effect(EffectKind.CLAIM_STATUS, ref.uid, StatusRecord(r.status)))
    return ClaimEntry(
        uid=ref.uid,
        namespace=ref.namespace,
        name=ref.name,
        state=ClaimState.PREPARE_COMPLETED,
        devices=r.devices,
        effects=tuple(effects),
        dies=plan.dies,
    )


def _entities(preparer: Preparer) -> dict[str, EntityInfo]:
    """The daemon's registry (raises Unavailable if it cannot be read: it is evidence)."""
    if preparer.daemon is None:
        return {}
    return {e.entity_id: e for e in preparer.daemon.list()}
