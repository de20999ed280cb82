"""``flexnpu-smi``: the one operator tool for this node's vNPUs, whole dies and residuals.

Usage::

    flexnpu-smi info [--json]                 one row per vNPU (virtual id) and whole die: quotas, usage,
                                              aclserver, pods (reservedFor), residual?
    flexnpu-smi cleanup --dry-run [--json]    what the residual reconciler would remove
    flexnpu-smi cleanup                       remove it now (what the node process does on its own)
    flexnpu-smi unregister -u CLAIM_UID       unprepare one claim exactly as the reconciler does for a
                                              residual (or stop an orphan aclserver no entry owns)
    flexnpu-smi adopt                         checkpoint untrusted: record what the node holds and the API allocated
    flexnpu-smi discard                       checkpoint untrusted: set damaged records aside, trust the rest
    flexnpu-smi uninstall [--yes] [--force]   after helm uninstall: list (remove with --yes) what the driver
                                              left on the node (kubeletplugin/uninstall.py)

It reads the node's checkpoint and talks to flexnpu-daemon and, when it can, the Kubernetes
API (``--kubeconfig`` or the in-cluster config). Without the API the PODS and RESIDUAL columns
say ``?`` and ``cleanup`` refuses (never delete on doubt); without the daemon the usage and
ACLSERVER columns are unknown (exit 3) and what the checkpoint says is still shown; without a
checkpoint (the daemon's container) it shows what the daemon runs. Node flags and their
``FLEXNPU_…`` twins are the node process's (``flexnpu-dra plugin --help``), so in the plugin
container it needs no flags. ``unregister`` takes the same locks as prepare, so it is safe
against a concurrent one. Exit codes: 0 success, 1 the request failed, 2 bad usage, 3 daemon or
API unreachable.

Subcommands are rows of :data:`COMMANDS` (name → help, argument adder, runner): add one there.
What ``info`` prints is rendered, purely, by ``kubeletplugin/smi_tables.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from controller.cleanup import Residual, has_consumer, residual_reason
from controller.kube import Kube, NotFound
from dra_driver import config
from dra_driver.checkpoint import CheckpointStore, ClaimEntry
from dra_driver.config import Config
from dra_driver.daemon_api.client import DaemonClient
from dra_driver.daemon_api.values import EntityInfo
from dra_driver.errors import FlexNPUError, Unavailable
from dra_driver.vnpu import ownership as vnpu_ledger
from dra_driver.vnpu import report as vnpu_report
from kubeletplugin import adopt
from kubeletplugin.smi_tables import COLUMNS, info_rows, render_table

if TYPE_CHECKING:
    from kubeletplugin.core import NodeCore

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


@dataclass
class Tool:
    """The node's configuration and the read-only views; the full node core only when it acts."""

    cfg: Config
    kube: Kube
    daemon: DaemonClient | None

    def store(self) -> CheckpointStore | None:
        """The checkpoint store, or None when this node has no checkpoint (nothing to read or lock)."""
        path = self.cfg.paths.checkpoint_file
        return CheckpointStore(path) if path.exists() else None

    def entries(self) -> dict[str, ClaimEntry]:
        store = self.store()
        return dict(store.read().claims) if store is not None else {}

    @contextlib.contextmanager
    def core(self) -> Iterator[NodeCore]:
        """The full node core (preparer, reconciler), built only to act; shares this tool's API client."""
        from kubeletplugin.core import NodeCore

        core = NodeCore(self.cfg, kube=self.kube)
        try:
            yield core
        finally:
            if core.daemon is not None:
                core.daemon.close()

    def hard_rows(self, entries: Mapping[str, ClaimEntry]) -> list[dict[str, str]]:
        """Hard vNPUs on the node with their template and owner (``dra_driver/vnpu/report.py``)."""
        from dra_driver import discovery, vnpu

        try:
            inventory = discovery.from_config(
                inventory=self.cfg.inventory, npu_smi=self.cfg.npu_smi
            ).discover()
        except FlexNPUError as err:
            print(f"flexnpu-smi: hard vNPUs unknown (discovery failed): {err}", file=sys.stderr)
            return []
        modes = {self.cfg.default_mode, *(str(m) for m in inventory.die_modes.values())}
        if not modes & {"hard", "all"}:
            return []
        manager = vnpu.from_config(
            inventory=inventory,
            emulated=self.cfg.inventory is not None,
            device_root=self.cfg.paths.device_root,
            npu_smi=self.cfg.npu_smi,
        )
        try:
            vnpus = manager.list()
        except FlexNPUError as err:
            print(f"flexnpu-smi: hard vNPUs unknown: {err}", file=sys.stderr)
            return []
        claims = {uid: (f"{e.namespace}/{e.name}", str(e.state)) for uid, e in entries.items()}
        book = vnpu_ledger.load(self.cfg.paths.state_dir)
        return vnpu_report.hard_rows(vnpus, ledger=book, claims=claims, inventory=inventory)

    def api_view(self, entry: ClaimEntry) -> tuple[str, str]:
        try:
            claim: Mapping[str, Any] | None = self.kube.get_claim(entry.namespace, entry.name)
        except NotFound:
            claim = None
        except FlexNPUError as err:
            return "?", f"? ({'API unreachable' if isinstance(err, Unavailable) else err.code})"
        pods = "-"
        if claim is not None and claim.get("metadata", {}).get("uid") == entry.uid:
            refs = (claim.get("status") or {}).get("reservedFor") or []
            pods = ",".join(f"{r.get('resource', 'pods')}/{r.get('name')}" for r in refs) or "-"
        reason = residual_reason(
            entry.uid, claim, driver_name=self.cfg.driver_name, pool_name=self.cfg.pool_name
        )
        if reason is None and claim is not None and not has_consumer(claim):
            reason = "no consumer in reservedFor (residual after the grace period)"
        return pods, f"yes: {reason}" if reason else "no"


# --- subcommands ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Command:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Tool, TextIO], int]


def _info_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="rows and the daemon's raw answer as JSON")


def _info(args: argparse.Namespace, tool: Tool, out: TextIO) -> int:
    entities: dict[str, EntityInfo] = {}
    daemon_error: FlexNPUError | None = None
    unbounded = ""
    if tool.daemon is not None:
        try:
            entities = {e.entity_id: e for e in tool.daemon.list(probe=True)}  # PING each: live state
            unbounded = tool.daemon.health().cgroup_problem
        except Unavailable as err:
            daemon_error = err
    entries = tool.entries()
    rows = info_rows(
        entries, entities, tool.api_view, daemon_known=tool.daemon is not None and daemon_error is None
    )
    rows += [{"VNPU": "-", **r} for r in tool.hard_rows(entries)]
    store = tool.store()
    doubts = store.doubts() if store is not None else []
    if args.json:
        doc = {
            "rows": rows,
            "entities": [_jsonable(e) for e in entities.values()],
            "checkpointTrusted": not doubts,
            "checkpointDoubts": doubts,
            "aclserversUnbounded": unbounded,
        }
        json.dump(doc, out, indent=2)
        out.write("\n")
    else:
        for why in doubts:
            out.write(f"CHECKPOINT UNTRUSTED (nothing is removed; flexnpu-smi adopt or discard): {why}\n")
        if unbounded:
            out.write(
                f"ACLSERVERS UNBOUNDED (no cgroups of their own; they die with the daemon's pod): {unbounded}\n"
            )
        out.write((render_table(rows, COLUMNS) if rows else "nothing prepared on this node") + "\n")
    if daemon_error is not None:
        print(f"flexnpu-smi: aclserver columns unknown: {daemon_error}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return EXIT_OK


def _cleanup_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    parser.add_argument("--json", action="store_true")


def _cleanup(args: argparse.Namespace, tool: Tool, out: TextIO) -> int:
    with tool.core() as core:
        findings = core.reconciler.plan() if args.dry_run else core.reconciler.reconcile_once()
    doc = {
        "residualClaims": [
            {"uid": r.uid, "namespace": r.namespace, "name": r.name, "reason": r.reason}
            for r in findings.residuals
        ],
        "interrupted": findings.interrupted,
        "orphans": [{"kind": o.kind, "uid": o.uid, "ref": o.ref} for o in findings.orphans],
        "kept": [
            {"uid": d.uid, "namespace": d.namespace, "name": d.name, "why": d.why} for d in findings.doubts
        ],
        "untrusted": findings.untrusted,
        "errors": findings.errors,
    }
    verb = "would remove" if args.dry_run or findings.untrusted else "removed"
    if args.json:
        json.dump({"dryRun": bool(args.dry_run), **doc}, out, indent=2)
        out.write("\n")
    else:
        if findings.untrusted:
            out.write("the checkpoint is not trusted: nothing was removed\n")
        for r in findings.residuals:
            out.write(f"{verb} residual claim {r.namespace}/{r.name} ({r.uid}): {r.reason}\n")
        for uid in findings.interrupted:
            out.write(f"{verb} half-done claim {uid} (interrupted prepare/unprepare)\n")
        for o in findings.orphans:
            out.write(f"{verb} orphan {o.describe()}\n")
        for d in findings.doubts:
            out.write(
                f"kept claim {d.namespace}/{d.name} ({d.uid}): the API's answer proves nothing ({d.why})\n"
            )
        for e in findings.errors:
            out.write(f"failed: {e}\n")
        if not (findings.residuals or findings.interrupted or findings.orphans or findings.doubts):
            out.write("nothing residual on this node\n")
    return EXIT_FAILED if findings.errors else EXIT_OK


def _unregister_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-u", "--uid", required=True, help="the claim UID (the daemon's entity ID)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def _unregister(args: argparse.Namespace, tool: Tool, out: TextIO) -> int:
    uid = args.uid
    entry = tool.entries().get(uid)
    if entry is not None:
        with tool.core() as core:
            core.reconciler.remove_claim(
                Residual(uid, entry.namespace, entry.name, "removed by flexnpu-smi unregister")
            )
        result = {"uid": uid, "unprepared": True, "aclserverStopped": False}
        message = f"unprepared claim {uid} (CDI spec, client.conf, aclserver and status removed)"
    elif tool.daemon is not None and tool.daemon.unregister(uid):
        result = {"uid": uid, "unprepared": False, "aclserverStopped": True}
        message = f"stopped orphan aclserver {uid} (no checkpoint entry)"
    else:
        print(f"flexnpu-smi: no claim or vNPU with ID {uid!r} on this node", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        json.dump(result, out)
        out.write("\n")
    else:
        out.write(message + "\n")
    return EXIT_OK


def _no_args(parser: argparse.ArgumentParser) -> None:
    del parser


def _adopt_or_discard(args: argparse.Namespace, tool: Tool, out: TextIO) -> int:
    """End a damaged checkpoint's doubt: adopt from evidence, or discard the damaged records."""
    with tool.core() as core:
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


def _uninstall_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--yes", action="store_true", help="remove (without it: list what would go)")
    parser.add_argument("--force", action="store_true", help="remove even while claims or aclservers remain")


def _uninstall(args: argparse.Namespace, tool: Tool, out: TextIO) -> int:
    from kubeletplugin import uninstall

    return uninstall.run(tool.cfg, tool.kube, tool.daemon, yes=args.yes, force=args.force, out=out)


COMMANDS: dict[str, Command] = {
    "info": Command(
        "every prepared claim, vNPU and whole die, with pods and residual state", _info_args, _info
    ),
    "cleanup": Command(
        "remove residual claims and orphans (or list them with --dry-run)", _cleanup_args, _cleanup
    ),
    "unregister": Command(
        "unprepare one claim as the reconciler would (or stop an orphan aclserver)",
        _unregister_args,
        _unregister,
    ),
    "adopt": Command(
        "rebuild the checkpoint entries of claims the node holds evidence of (damaged checkpoint)",
        _no_args,
        _adopt_or_discard,
    ),
    "discard": Command(
        "set damaged checkpoint records aside and trust the rest (damaged checkpoint)",
        _no_args,
        _adopt_or_discard,
    ),
    "uninstall": Command(
        "after helm uninstall: list, or remove with --yes, what the driver left on this node",
        _uninstall_args,
        _uninstall,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flexnpu-smi", description=__doc__.split("\n\n")[0])
    config.add_flags(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        cmd.add_arguments(sub.add_parser(name, help=cmd.help, description=cmd.help))
    return parser


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
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
    except FlexNPUError as err:
        print(f"flexnpu-smi: {err}", file=sys.stderr)
        return EXIT_USAGE
    tool = Tool(cfg, kube, DaemonClient(cfg.daemon_socket, timeout=20.0) if cfg.daemon_socket else None)
    try:
        return COMMANDS[args.command].run(args, tool, out or sys.stdout)
    except Unavailable as err:
        print(f"flexnpu-smi: {err}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except FlexNPUError as err:
        print(f"flexnpu-smi: {err}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        kube.close()
        if tool.daemon is not None:
            tool.daemon.close()


def _jsonable(entity: EntityInfo) -> dict[str, Any]:
    doc = dataclasses.asdict(entity)
    doc["state"] = str(entity.state)
    return doc


if __name__ == "__main__":
    sys.exit(main())
