"""``flexnpu-smi``: the operator's view of this node's vNPUs, whole dies and residuals.

Usage::

    flexnpu-smi info [--json]                 every prepared claim and vNPU, with pods and residual state
    flexnpu-smi cleanup --dry-run [--json]    what the residual reconciler would remove
    flexnpu-smi cleanup                       remove it now (what the node process does on its own)
    flexnpu-smi unregister -u CLAIM_UID       unprepare one claim, exactly as the reconciler would
    flexnpu-smi adopt                         checkpoint untrusted: record what the node holds and the API allocated
    flexnpu-smi discard                       checkpoint untrusted: set damaged records aside, trust the rest

It reads the node's checkpoint and talks to flexnpu-daemon and, when it can, the Kubernetes
API (``--kubeconfig`` or the in-cluster config); without the API the PODS and RESIDUAL columns
say ``?`` and ``cleanup`` refuses (never delete on doubt). Node flags and their ``FLEXNPU_…``
twins are the node process's (``flexnpu-dra plugin --help``), so in the plugin container it needs
no flags. ``unregister`` takes the same locks as prepare, so it is safe against a concurrent one.
Exit codes: 0 success, 1 the request failed, 2 bad usage, 3 daemon or API unreachable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from controller.cleanup import has_consumer, residual_reason
from controller.kube import Kube, NotFound
from dra_driver import config, logs
from dra_driver import smi as daemon_smi
from dra_driver.errors import FlexNPUError, Unavailable
from dra_driver.vnpu import ledger as vnpu_ledger
from dra_driver.vnpu import report as vnpu_report
from kubeletplugin import adopt
from kubeletplugin.node import NodeCore

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flexnpu-smi", description=__doc__.split("\n\n")[0])
    config.add_flags(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = sub.add_parser("info", help="every prepared claim and vNPU, with pods and residual state")
    info.add_argument("--json", action="store_true")
    cleanup = sub.add_parser(
        "cleanup", help="remove residual claims and orphans (or list them with --dry-run)"
    )
    cleanup.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    cleanup.add_argument("--json", action="store_true")
    unreg = sub.add_parser("unregister", help="unprepare one claim (or stop an orphan aclserver)")
    unreg.add_argument("-u", "--uid", required=True, help="the claim UID (entity ID)")
    sub.add_parser(
        "adopt",
        help="rebuild the checkpoint entries of claims the node holds evidence of (damaged checkpoint)",
    )
    sub.add_parser(
        "discard", help="set damaged checkpoint records aside and trust the rest (damaged checkpoint)"
    )
    return parser


def info_rows(core: NodeCore, entities: Mapping[str, Any]) -> list[dict[str, str]]:
    """One row per prepared device: claim, die, mode, quota, aclserver, endpoint, pods, residual."""
    entries = core.store.read().claims
    rows: list[dict[str, str]] = []
    for uid, entry in sorted(entries.items()):
        pods, residual = _api_view(core, entry)
        ent = entities.get(uid)
        shares = {s.share.die_phy_id: s for s in ent.shares} if ent else {}
        for d in entry.dies:
            usage = shares.get(d.phy)
            mem = compute = "-"
            if usage is not None:
                used = "-" if usage.memory_used_bytes < 0 else str(usage.memory_used_bytes // daemon_smi.MIB)
                mem = f"{used}/{usage.share.memory_bytes // daemon_smi.MIB}"
                busy = "-" if usage.compute_used_percent < 0 else str(usage.compute_used_percent)
                compute = f"{busy}/{'-' if usage.share.memory_only else usage.share.compute_percent}"
            rows.append(
                {
                    "CLAIM UID": uid,
                    "CLAIM": f"{entry.namespace}/{entry.name}",
                    "DEVICE": d.device,
                    "DIE": str(d.phy),
                    "MODE": str(d.mode),
                    "MEM(MiB) USED/QUOTA": mem,
                    "COMPUTE(%) USED/QUOTA": compute,
                    "POLICY": d.policy or "-",
                    "ACLSERVER": f"{ent.pid} {ent.state}" if ent else "-",
                    "ENDPOINT": _endpoint(ent),
                    "STATE": str(entry.state),
                    "PODS": pods,
                    "RESIDUAL": residual,
                }
            )
    for uid, ent in sorted(entities.items()):
        if uid not in entries:
            rows.append(
                {
                    "CLAIM UID": uid,
                    "CLAIM": f"{ent.namespace}/{ent.name}",
                    "DEVICE": "-",
                    "DIE": ",".join(str(s.share.die_phy_id) for s in ent.shares),
                    "MODE": "soft",
                    "MEM(MiB) USED/QUOTA": "-",
                    "COMPUTE(%) USED/QUOTA": "-",
                    "POLICY": ",".join(sorted({s.share.policy for s in ent.shares})),
                    "ACLSERVER": f"{ent.pid} {ent.state}",
                    "ENDPOINT": _endpoint(ent),
                    "STATE": "-",
                    "PODS": "-",
                    "RESIDUAL": "yes: orphan aclserver (no checkpoint entry)",
                }
            )
    return rows + _hard_rows(core, entries)


def _hard_rows(core: NodeCore, entries: Mapping[str, Any]) -> list[dict[str, str]]:
    """Hard vNPUs on the node with their template and owner (``dra_driver/vnpu/report.py``)."""
    if not core.hard_split:
        return []
    try:
        vnpus = core.vnpus.list()
    except FlexNPUError as err:
        print(f"flexnpu-smi: hard vNPUs unknown: {err}", file=sys.stderr)
        return []
    claims = {uid: (f"{e.namespace}/{e.name}", str(e.state)) for uid, e in entries.items()}
    book = vnpu_ledger.load(core.cfg.paths.state_dir)
    return vnpu_report.hard_rows(vnpus, ledger=book, claims=claims, inventory=core.inventory)


def _api_view(core: NodeCore, entry: Any) -> tuple[str, str]:
    try:
        claim: Mapping[str, Any] | None = core.kube.get_claim(entry.namespace, entry.name)
    except NotFound:
        claim = None
    except FlexNPUError:
        return "?", "? (API unreachable)"
    pods = "-"
    if claim is not None and claim.get("metadata", {}).get("uid") == entry.uid:
        refs = (claim.get("status") or {}).get("reservedFor") or []
        pods = ",".join(f"{r.get('resource', 'pods')}/{r.get('name')}" for r in refs) or "-"
    reason = residual_reason(entry.uid, claim, driver_name=core.cfg.driver_name, pool_name=core.cfg.pool_name)
    if reason is None and claim is not None and not has_consumer(claim):
        reason = "no consumer in reservedFor (residual after the grace period)"
    return pods, f"yes: {reason}" if reason else "no"


def _endpoint(ent: Any) -> str:
    if ent is None or not ent.endpoints.tcp_port:
        return "-"
    return f"{ent.endpoints.tcp_host}:{ent.endpoints.tcp_port}"


COLUMNS = (
    "CLAIM UID", "CLAIM", "DEVICE", "DIE", "MODE", "MEM(MiB) USED/QUOTA", "COMPUTE(%) USED/QUOTA", "POLICY",
    "ACLSERVER", "ENDPOINT", "STATE", "PODS", "RESIDUAL",
)  # fmt: skip


def run(args: argparse.Namespace, core: NodeCore, out: TextIO) -> int:
    if args.command == "info":
        entities: dict[str, Any] = {}
        daemon_error: FlexNPUError | None = None
        if core.daemon is not None:
            try:
                entities = {e.entity_id: e for e in core.daemon.list()}
            except Unavailable as err:
                daemon_error = err
        rows = info_rows(core, entities)
        doubts = core.store.doubts()
        if args.json:
            json.dump(
                {"rows": rows, "checkpointTrusted": not doubts, "checkpointDoubts": doubts}, out, indent=2
            )
            out.write("\n")
        else:
            for why in doubts:
                out.write(f"CHECKPOINT UNTRUSTED (nothing is removed; flexnpu-smi adopt or discard): {why}\n")
            table = daemon_smi.render_table(rows, COLUMNS) if rows else "nothing prepared on this node"
            out.write(table + "\n")
        if daemon_error is not None:
            print(f"flexnpu-smi: aclserver columns unknown: {daemon_error}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        return EXIT_OK
    if args.command in ("adopt", "discard"):
        if args.command == "adopt":
            outcome = adopt.adopt(core.preparer, lambda: core.kube.list_claims()[0])
        else:
            outcome = adopt.discard(core.preparer)
        for uid in outcome.adopted:
            out.write(f"adopted claim {uid}\n")
        for uid in outcome.unexplained:
            out.write(f"left for the reconciler: {uid} (no claim allocated here explains it)\n")
        for path in outcome.kept:
            out.write(f"damaged record kept at {path}\n")
        out.write("checkpoint trusted again\n")
        return EXIT_OK
    if args.command == "cleanup":
        findings = core.reconciler.plan() if args.dry_run else core.reconciler.reconcile_once()
        doc = {
            "residualClaims": [
                {"uid": r.uid, "namespace": r.namespace, "name": r.name, "reason": r.reason}
                for r in findings.residuals
            ],
            "interrupted": findings.interrupted,
            "orphans": [{"kind": o.kind, "uid": o.uid, "ref": o.ref} for o in findings.orphans],
        }
        verb = "would remove" if args.dry_run else "removed"
        if args.json:
            json.dump({"dryRun": bool(args.dry_run), **doc}, out, indent=2)
            out.write("\n")
        else:
            for r in findings.residuals:
                out.write(f"{verb} residual claim {r.namespace}/{r.name} ({r.uid}): {r.reason}\n")
            for uid in findings.interrupted:
                out.write(f"{verb} half-done claim {uid} (interrupted prepare/unprepare)\n")
            for o in findings.orphans:
                out.write(f"{verb} orphan {o.describe()}\n")
            if not (findings.residuals or findings.interrupted or findings.orphans):
                out.write("nothing residual on this node\n")
        return EXIT_OK
    # unregister
    uid = args.uid
    if uid in core.store.read().claims:
        core.preparer.unprepare_uid(uid, logs.claim_logger(uid))
        out.write(f"unprepared claim {uid} (CDI spec, client.conf, aclserver and status removed)\n")
        return EXIT_OK
    if core.daemon is not None and core.daemon.unregister(uid):
        out.write(f"stopped orphan aclserver {uid} (no checkpoint entry)\n")
        return EXIT_OK
    print(f"flexnpu-smi: no claim or vNPU with ID {uid!r} on this node", file=sys.stderr)
    return EXIT_FAILED


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    values = config.resolve(args, os.environ)
    if not values.get("node_name"):
        values["node_name"] = os.uname().nodename
    try:
        cfg = config.build(values)
        try:
            kube = Kube.from_config(cfg.kubeconfig)
        except FlexNPUError as err:  # no API here: show what the node knows, mark API columns "?"
            print(f"flexnpu-smi: no Kubernetes API ({err}); PODS and RESIDUAL unknown", file=sys.stderr)
            kube = Kube.offline()
        core = NodeCore(cfg, kube=kube)
    except FlexNPUError as err:
        print(f"flexnpu-smi: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return run(args, core, out or sys.stdout)
    except Unavailable as err:
        print(f"flexnpu-smi: {err}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except FlexNPUError as err:
        print(f"flexnpu-smi: {err}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        core.close()


if __name__ == "__main__":
    sys.exit(main())
