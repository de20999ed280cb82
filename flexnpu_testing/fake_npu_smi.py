"""A fake ``npu-smi`` for tests that keeps state across calls: vNPUs, IDs, errors on demand.

It prints the formats ``dra_driver/discovery/npu_smi.py`` and ``dra_driver/vnpu/npu_smi.py``
parse, and keeps its vNPUs in the emulated driver's state (``dra_driver/vnpu/emulated.py``), so a
vNPU made through this command is seen by the emulated backend and the other way round, and its
device node ``<device-root>/dev/vdavinci<id>`` exists while it lives.

A fake lives in a home directory made by :func:`install`, which writes an executable ``npu-smi``
there (a shell script that runs this module with the home directory)::

    exe = fake_npu_smi.install(tmp / "smi", device_root=root, samples=Path("tests/data/npu-smi/a2-8x910b4"))
    fake_npu_smi.inject(tmp / "smi", "create-vnpu", rc=1, stderr="Error: device busy")   # next call fails

Commands: ``info``, ``info -m``, ``info -t board -i N -c C`` (from the recorded ``samples``
directory, see ``tests/data/npu-smi/README.md``), ``info -t template-info``,
``info -t vnpu-mode``, ``set -t vnpu-mode -d 0|1``, ``info -t info-vnpu -i N -c C``,
``set -t create-vnpu -i N -c C -f TEMPLATE -v ID``, ``set -t destroy-vnpu -i N -c C -v ID``.
Anything else exits 1 with a message on stderr, like npu-smi. Every call is appended to
``calls.log`` in the home directory.

Errors on demand (``inject``): for a command key (``create-vnpu``, ``info-vnpu``, ``info``, …)
print ``stdout``/``stderr`` and exit ``rc`` instead of answering, ``times`` times (-1 = always);
with ``apply=True`` the command takes effect first (a create that makes the vNPU and still
fails).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dra_driver import templates
from dra_driver.devices import Die, Inventory
from dra_driver.discovery import emulated, npu_smi
from dra_driver.vnpu.emulated import CONTAINER_MODE, HdkError, HdkState
from flexnpu_testing import REPO

__all__ = ["calls", "inject", "install", "main", "set_in_use"]


def install(
    home: Path,
    *,
    device_root: Path,
    samples: Path | None = None,
    inventory: Path | None = None,
) -> Path:
    """Make a fake in ``home``; returns the path of its ``npu-smi`` executable.

    The dies come from ``samples`` (recorded npu-smi outputs) or an emulated ``inventory`` file.
    """
    if (samples is None) == (inventory is None):
        raise ValueError("give exactly one of samples or inventory")
    home.mkdir(parents=True, exist_ok=True)
    config = {
        "samples": str(samples) if samples else None,
        "inventory": str(inventory) if inventory else None,
        "deviceRoot": str(device_root),
    }
    (home / "config.json").write_text(json.dumps(config))
    exe = home / "npu-smi"
    exe.write_text(
        f"#!/bin/sh\nexec env PYTHONPATH={shlex.quote(str(REPO))}${{PYTHONPATH:+:$PYTHONPATH}}"
        f' {shlex.quote(sys.executable)} -m flexnpu_testing.fake_npu_smi {shlex.quote(str(home))} "$@"\n'
    )
    exe.chmod(0o755)
    return exe


def inject(
    home: Path,
    command: str,
    *,
    rc: int = 1,
    stdout: str = "",
    stderr: str = "",
    times: int = 1,
    apply: bool = False,
) -> None:
    """Make the next ``times`` calls of ``command`` answer this way (see the module docstring)."""
    hdk = _hdk(home)
    with hdk.transaction() as state:
        state["inject"][command] = {
            "rc": rc,
            "stdout": stdout,
            "stderr": stderr,
            "times": times,
            "apply": apply,
        }


def set_in_use(home: Path, vnpu_id: int, in_use: bool = True) -> None:
    """Mark a vNPU as used by a container (npu-smi Status 1), as the runtime would."""
    hdk = _hdk(home)
    with hdk.transaction() as state:
        for v in state["vnpus"]:
            if int(v["id"]) == vnpu_id:
                v["inUse"] = in_use


def calls(home: Path) -> list[list[str]]:
    """Every argv the fake was called with, in order."""
    path = home / "calls.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write("usage: python -m flexnpu_testing.fake_npu_smi HOME ARGS...\n")
        return 2
    home, cmd = Path(args[0]), args[1:]
    with (home / "calls.log").open("a") as log:
        log.write(json.dumps(cmd) + "\n")
    hdk = _hdk(home)
    key = _key(cmd)
    with hdk.transaction() as state:
        spec = state["inject"].get(key)
        if spec is not None:
            if spec["times"] > 0:
                spec["times"] -= 1
            if spec["times"] == 0:
                del state["inject"][key]
            if spec.get("apply"):
                _answer(home, hdk, state, cmd)
            sys.stdout.write(spec["stdout"])
            sys.stderr.write(spec["stderr"])
            return int(spec["rc"])
        return _answer(home, hdk, state, cmd)


def _answer(home: Path, hdk: HdkState, state: dict[str, Any], cmd: list[str]) -> int:
    opts = _options(cmd)
    try:
        if cmd[:1] == ["info"] and len(cmd) in (1, 2) and (len(cmd) == 1 or cmd[1] == "-m"):
            return _sample(home, "info.txt" if len(cmd) == 1 else "info-m.txt")
        if cmd[:3] == ["info", "-t", "board"]:
            return _sample(home, f"board-{opts['-i']}-{opts['-c']}.txt")
        if cmd[:3] == ["info", "-t", "template-info"]:
            return _print(_render_template_info(hdk.inventory))
        if cmd[:3] == ["info", "-t", "vnpu-mode"]:
            return _print(f"vnpu-mode : {state['vnpuMode']}\n")
        if cmd[:3] == ["set", "-t", "vnpu-mode"]:
            state["vnpuMode"] = CONTAINER_MODE if opts["-d"] == "0" else "vm"
            return _print("Status : OK\nMessage : set vnpu-mode success\n")
        if cmd[:3] == ["info", "-t", "info-vnpu"]:
            die = _die(hdk.inventory, opts)
            return _print(_render_info_vnpu(die, [v for v in hdk.vnpus(state) if v.phy_id == die.phy_id]))
        if cmd[:3] == ["set", "-t", "create-vnpu"]:
            die = _die(hdk.inventory, opts)
            made = hdk.create(state, die, opts["-f"], int(opts["-v"]))
            return _print(f"Status : OK\nMessage : Create vnpu success (vnpu id {made.vnpu_id})\n")
        if cmd[:3] == ["set", "-t", "destroy-vnpu"]:
            die = _die(hdk.inventory, opts)
            if not hdk.destroy(state, int(opts["-v"])):
                return _fail(
                    f"Error: vnpu {opts['-v']} does not exist on NPU {die.card_id} chip {die.chip_id}"
                )
            return _print(f"Status : OK\nMessage : Destroy vnpu {opts['-v']} success\n")
    except HdkError as exc:
        return _fail(f"Error: {exc}")
    except (KeyError, ValueError, LookupError) as exc:
        return _fail(f"Error: bad arguments {' '.join(cmd)}: {exc}")
    return _fail(f"Error: unsupported command or no such device: {' '.join(cmd)}")


def _key(cmd: list[str]) -> str:
    if len(cmd) >= 3 and cmd[1] == "-t":
        return cmd[2]
    return " ".join(cmd)


def _options(cmd: list[str]) -> dict[str, str]:
    return {cmd[i]: cmd[i + 1] for i in range(len(cmd) - 1) if cmd[i].startswith("-")}


def _die(inventory: Inventory, opts: dict[str, str]) -> Die:
    card, chip = int(opts["-i"]), int(opts["-c"])
    for die in inventory.dies:
        if (die.card_id, die.chip_id) == (card, chip):
            return die
    raise LookupError(f"no chip {chip} on NPU {card}")


def _render_info_vnpu(die: Die, vnpus: list[Any]) -> str:
    offered = {t.name: t for t in templates.for_model(die.model)}
    used = [offered[v.template] for v in vnpus if v.template in offered]
    mem_total = templates.template_memory_mib(die.model, die.memory_mib) // 1024
    lines = [
        "+" + "-" * 79 + "+",
        "| NPU resource static info as follow:".ljust(80) + "|",
        "| Format:Free/Total                   NA: Currently, query is not supported.".ljust(80) + "|",
        "| AICORE    Memory    AICPU".ljust(80) + "|",
        "|           GB".ljust(80) + "|",
        "|" + "=" * 79 + "|",
        (
            f"| {die.aicore - sum(t.aicore for t in used)}/{die.aicore}".ljust(11)
            + f"{mem_total - sum(t.memory_mib for t in used) // 1024}/{mem_total}".ljust(10)
            + f"{die.aicpu - sum(t.aicpu for t in used)}/{die.aicpu}"
        ).ljust(80)
        + "|",
        "+" + "-" * 79 + "+",
        f"| Total number of vnpu: {len(vnpus)}".ljust(80) + "|",
        "+" + "-" * 79 + "+",
        "|  Vnpu ID  |  Vgroup ID     |  Container ID  |  Status  |  Template Name".ljust(80) + "|",
        "+" + "-" * 79 + "+",
    ]
    for v in vnpus:
        container = "a1b2c3d4e5f6" if v.in_use else "000000000000"
        lines.append(
            f"|  {v.vnpu_id:<9}|  {v.vgroup:<14}|  {container:<14}|  {int(v.in_use):<8}|  {v.template}".ljust(
                80
            )
            + "|"
        )
    lines.append("+" + "-" * 79 + "+")
    return "\n".join(lines) + "\n"


def _render_template_info(inventory: Inventory) -> str:
    models = sorted({d.model for d in inventory.dies})
    rows = [t for m in models[:1] for t in templates.for_model(m)]
    lines = [
        "+" + "-" * 71 + "+",
        "| NPU instance template info is:".ljust(72) + "|",
        "| Name                AICORE    Memory    AICPU".ljust(72) + "|",
        "|                               GB".ljust(72) + "|",
        "+" + "=" * 71 + "+",
    ]
    for t in rows:
        lines.append(f"| {t.name:<20}{t.aicore:<10}{t.memory_mib // 1024:<10}{t.aicpu}".ljust(72) + "|")
    lines.append("+" + "-" * 71 + "+")
    return "\n".join(lines) + "\n"


def _sample(home: Path, name: str) -> int:
    samples = _config(home)["samples"]
    path = Path(samples) / name if samples else None
    if path is None or not path.is_file():
        return _fail(f"Error: unsupported command or no such device ({name})")
    return _print(path.read_text())


def _print(text: str) -> int:
    sys.stdout.write(text)
    return 0


def _fail(message: str) -> int:
    sys.stderr.write(message + "\n")
    return 1


def _config(home: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((home / "config.json").read_text())
    return out


def _hdk(home: Path) -> HdkState:
    config = _config(home)
    return HdkState(home / "state.json", Path(config["deviceRoot"]), _inventory(config))


def _inventory(config: dict[str, Any]) -> Inventory:
    if config["inventory"]:
        return emulated.load_inventory(Path(config["inventory"]))
    samples = Path(config["samples"])
    table = npu_smi.parse_info((samples / "info.txt").read_text())
    logic_ids = npu_smi.parse_logic_ids((samples / "info-m.txt").read_text())
    boards = {
        (row.npu_id, row.chip_id): npu_smi.parse_board(
            (samples / f"board-{row.npu_id}-{row.chip_id}.txt").read_text(), where="board"
        )
        for row in table.rows
    }
    return npu_smi.build_inventory(table, boards=boards, logic_ids=logic_ids, numa_nodes={})


if __name__ == "__main__":
    sys.exit(main())
