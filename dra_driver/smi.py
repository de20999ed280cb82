"""``flexnpu-smi``: inspect and manage the vNPUs the FlexNPU daemon runs on this node.

Usage::

    flexnpu-smi info [--json]                  one row per vNPU
    flexnpu-smi unregister -u CLAIM_UID [--json]

Global options: ``--socket`` (env ``FLEXNPU_DAEMON_SOCKET``), ``--timeout``.
Exit codes: 0 success, 1 the request failed (e.g. unknown ID), 2 bad usage, 3 daemon unreachable.
Subcommands are rows of :data:`COMMANDS` (name → help, argument adder, runner), so new ones
(``cleanup``, checkpoint-based columns) plug in without touching the dispatcher.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from dra_driver.daemon.client import DEFAULT_SOCKET, DaemonClient
from dra_driver.daemon.model import EntityInfo
from dra_driver.errors import FlexNPUError, Unavailable

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
SOCKET_ENV = "FLEXNPU_DAEMON_SOCKET"
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Command:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, DaemonClient, TextIO], int]


# ---- info ----


def info_rows(entities: Sequence[EntityInfo]) -> list[dict[str, str]]:
    """Pure: one display row per vNPU (share) of every entity, sorted by entity then virtual ID."""
    rows = []
    for e in sorted(entities, key=lambda x: x.entity_id):
        ep = e.endpoints
        endpoint = f"{ep.tcp_host}:{ep.tcp_port}" if ep.tcp_port else "-"
        for u in sorted(e.shares, key=lambda x: x.share.virtual_id):
            s = u.share
            mem_used = "-" if u.memory_used_bytes < 0 else str(u.memory_used_bytes // MIB)
            cpu_used = "-" if u.compute_used_percent < 0 else str(u.compute_used_percent)
            rows.append(
                {
                    "ENTITY": e.entity_id,
                    "VNPU": str(s.virtual_id),
                    "DIE": str(s.die_phy_id),
                    "MEM(MiB) USED/QUOTA": f"{mem_used}/{s.memory_bytes // MIB}",
                    "COMPUTE(%) USED/QUOTA": f"{cpu_used}/{'-' if s.memory_only else s.compute_percent}",
                    "POLICY": s.policy,
                    "PID": str(e.pid) if e.pid else "-",
                    "STATE": str(e.state) + (f" (restarts {e.restarts})" if e.restarts else ""),
                    "ENDPOINT": endpoint,
                }
            )
    return rows


def render_table(rows: Sequence[Mapping[str, str]], columns: Sequence[str]) -> str:
    """Pure: left-aligned columns separated by two spaces."""
    widths = [max([len(c)] + [len(r[c]) for r in rows]) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(r[c].ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


INFO_COLUMNS = (
    "ENTITY",
    "VNPU",
    "DIE",
    "MEM(MiB) USED/QUOTA",
    "COMPUTE(%) USED/QUOTA",
    "POLICY",
    "PID",
    "STATE",
    "ENDPOINT",
)


def _info_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the daemon's List answer as JSON")


def _info(args: argparse.Namespace, client: DaemonClient, out: TextIO) -> int:
    entities = client.list(probe=True)
    if args.json:
        json.dump({"entities": [_jsonable(e) for e in entities]}, out, indent=2, sort_keys=True)
        out.write("\n")
    elif entities:
        out.write(render_table(info_rows(entities), INFO_COLUMNS) + "\n")
    else:
        out.write("no vNPUs registered\n")
    return EXIT_OK


# ---- unregister ----


def _unregister_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-u", "--uid", required=True, help="entity ID (the claim UID) to stop")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def _unregister(args: argparse.Namespace, client: DaemonClient, out: TextIO) -> int:
    found = client.unregister(args.uid)
    if args.json:
        json.dump({"entity_id": args.uid, "found": found}, out)
        out.write("\n")
    if not found:
        print(f"flexnpu-smi: no vNPU with entity ID {args.uid!r} is registered", file=sys.stderr)
        return EXIT_FAILED
    if not args.json:
        out.write(f"unregistered {args.uid}\n")
    return EXIT_OK


COMMANDS: dict[str, Command] = {
    "info": Command("show every vNPU: quotas, usage, aclserver state, endpoint", _info_args, _info),
    "unregister": Command(
        "stop a vNPU group's aclserver and remove its files", _unregister_args, _unregister
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flexnpu-smi", description="Inspect and manage FlexNPU vNPUs.")
    parser.add_argument(
        "--socket",
        default=None,
        help=f"daemon socket (env {SOCKET_ENV}; default {DEFAULT_SOCKET})",
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per daemon call (default 10)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        cmd.add_arguments(sub.add_parser(name, help=cmd.help, description=cmd.help))
    return parser


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    socket_path = args.socket or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET
    stream = out or sys.stdout
    try:
        with DaemonClient(socket_path, timeout=args.timeout) as client:
            return COMMANDS[args.command].run(args, client, stream)
    except Unavailable as exc:
        print(f"flexnpu-smi: {exc.message} [{exc.code}]", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except FlexNPUError as exc:
        print(f"flexnpu-smi: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _jsonable(entity: EntityInfo) -> dict[str, Any]:
    doc = dataclasses.asdict(entity)
    doc["state"] = str(entity.state)
    return doc


if __name__ == "__main__":
    sys.exit(main())
