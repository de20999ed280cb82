"""The emulated HDK: vNPUs of an emulated node, kept in a state file, with their device nodes.

:class:`HdkState` is what the Ascend driver would hold: the vNPU mode and the vNPUs per chip. It
refuses what the real one refuses (a template the chip model does not offer, an ID outside the
die's range or already taken, more than the die has left), under a file lock, and makes or
removes ``<device-root>/dev/vdavinci<id>``. :class:`EmulatedVnpus` is the
:class:`~dra_driver.vnpu.VnpuManager` on top of it; ``flexnpu_testing/fake_npu_smi.py`` puts
an ``npu-smi`` command line on the same state, so both backends see one world.

The state file (JSON, written with ``dra_driver/files.py``)::

    {"vnpuMode": "container", "vnpus": [{"id": 100, "phy": 0, "card": 0, "chip": 0,
      "template": "vir10_3c_32g", "vgroup": 0, "inUse": false}], "inject": {...}}

``inject`` belongs to the fake npu-smi (errors on demand) and is kept as it is.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dra_driver import files, templates
from dra_driver.devices import Die, Inventory
from dra_driver.errors import ErrorCode, InvalidInput, StateError, Unavailable
from dra_driver.templates import Template
from dra_driver.vnpu import Vnpu, check_template

__all__ = ["CONTAINER_MODE", "DEFAULT_STATE_FILE", "EmulatedVnpus", "HdkError", "HdkState"]

DEFAULT_STATE_FILE = "var/lib/flexnpu-hdk/vnpus.json"
"""Under the device root: where the emulated driver keeps its vNPUs."""
CONTAINER_MODE = "container"
LOCK_TIMEOUT_SECONDS = 10.0
NULL_DEVICE = (1, 3)

State = dict[str, Any]


class HdkError(Exception):
    """What the emulated driver refuses; ``code`` is the ErrorCode a backend reports."""

    def __init__(self, message: str, code: ErrorCode) -> None:
        super().__init__(message)
        self.code = code


class HdkState:
    """The emulated driver's vNPU table for the dies of ``inventory`` (one JSON file)."""

    def __init__(self, state_file: Path, device_root: Path, inventory: Inventory) -> None:
        self.state_file = state_file
        self.device_root = device_root
        self.inventory = inventory

    @contextmanager
    def transaction(self) -> Iterator[State]:
        """Read, let the caller change, write back atomically, all under the file lock."""
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        with files.locked(self.state_file.with_suffix(".lock"), timeout=LOCK_TIMEOUT_SECONDS):
            state = self.read()
            before = json.dumps(state, sort_keys=True)
            yield state
            after = json.dumps(state, sort_keys=True)
            if after != before:
                # Not fsynced: it stands in for the driver's in-kernel state, which a power loss
                # drops anyway; a process crash keeps the page cache.
                files.write_atomic(self.state_file, after.encode(), mode=0o600, sync=False)

    def read(self) -> State:
        try:
            raw = files.read_nofollow(self.state_file)
        except FileNotFoundError:
            return {"vnpuMode": CONTAINER_MODE, "vnpus": [], "inject": {}}
        state: State = json.loads(raw)
        state.setdefault("vnpuMode", CONTAINER_MODE)
        state.setdefault("vnpus", [])
        state.setdefault("inject", {})
        return state

    def vnpus(self, state: State) -> tuple[Vnpu, ...]:
        return tuple(
            sorted(
                (
                    Vnpu(
                        vnpu_id=int(v["id"]),
                        phy_id=int(v["phy"]),
                        card_id=int(v["card"]),
                        chip_id=int(v["chip"]),
                        template=str(v["template"]),
                        vgroup=int(v.get("vgroup", 0)),
                        in_use=bool(v.get("inUse", False)),
                    )
                    for v in state["vnpus"]
                ),
                key=lambda v: v.vnpu_id,
            )
        )

    def create(self, state: State, die: Die, template_name: str, vnpu_id: int) -> Vnpu:
        """Add the vNPU to ``state`` and make its device node; HdkError if the driver would refuse."""
        if state["vnpuMode"] != CONTAINER_MODE:
            raise HdkError(f"the vNPU mode is {state['vnpuMode']!r}, not container", ErrorCode.VNPU_MODE)
        try:
            template = check_template(die, template_name, self.inventory)
        except InvalidInput as exc:
            raise HdkError(exc.message, ErrorCode.TEMPLATE_UNSUPPORTED) from None
        if vnpu_id not in templates.vnpu_id_range(die.model, die.phy_id):
            raise HdkError(
                f"vNPU ID {vnpu_id} is outside {templates.vnpu_id_range(die.model, die.phy_id)}",
                ErrorCode.VNPU_ID_IN_USE,
            )
        existing = self.vnpus(state)
        if any(v.vnpu_id == vnpu_id for v in existing):
            raise HdkError(f"vNPU ID {vnpu_id} already exists", ErrorCode.VNPU_ID_IN_USE)
        on_die = [v for v in existing if v.phy_id == die.phy_id]
        self._check_room(die, template, on_die)
        entry = {
            "id": vnpu_id,
            "phy": die.phy_id,
            "card": die.card_id,
            "chip": die.chip_id,
            "template": template.name,
            "vgroup": len(on_die),
            "inUse": False,
        }
        state["vnpus"].append(entry)
        self._make_node(vnpu_id)
        return self.vnpus({"vnpus": [entry]})[0]

    def destroy(self, state: State, vnpu_id: int) -> bool:
        before = len(state["vnpus"])
        state["vnpus"] = [v for v in state["vnpus"] if int(v["id"]) != vnpu_id]
        files.remove_nofollow(self.node_path(vnpu_id))
        return len(state["vnpus"]) != before

    def node_path(self, vnpu_id: int) -> Path:
        return self.device_root / "dev" / f"vdavinci{vnpu_id}"

    def _check_room(self, die: Die, template: Template, on_die: list[Vnpu]) -> None:
        offered = {t.name: t for t in templates.for_model(die.model, self.inventory.templates)}
        used = [offered[v.template] for v in on_die if v.template in offered]
        media_total = templates.media_of(die.model)
        checks = [
            ("AI Cores", sum(t.aicore for t in used) + template.aicore, die.aicore),
            ("AI CPUs", sum(t.aicpu for t in used) + template.aicpu, die.aicpu),
            (
                "memory MiB",
                sum(t.memory_mib for t in used) + template.memory_mib,
                templates.template_memory_mib(die.model, die.memory_mib),
            ),
        ]
        if media_total is not None:
            checks.append(("media", sum(t.media or 0 for t in used) + (template.media or 0), media_total))
        for what, need, have in checks:
            if need > have:
                raise HdkError(
                    f"die {die.phy_id} has not enough {what} left for {template.name}: {need} > {have}",
                    ErrorCode.VNPU_FAILED,
                )

    def _make_node(self, vnpu_id: int) -> None:
        """A character device with the numbers of ``/dev/null`` (root), else an empty file.

        Like the emulated node's other device nodes (``flexnpu_testing/devroot.py``): a
        runtime that injects it (podman, containerd) needs a real device node.
        """
        path = self.node_path(vnpu_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            return
        if os.geteuid() == 0:
            with contextlib.suppress(PermissionError):
                os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(*NULL_DEVICE))
                path.chmod(0o666)
                return
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        os.close(fd)


class EmulatedVnpus:
    """:class:`~dra_driver.vnpu.VnpuManager` of an emulated node (state under ``device_root``)."""

    def __init__(self, device_root: Path, inventory: Inventory, *, state_file: Path | None = None) -> None:
        self.hdk = HdkState(state_file or device_root / DEFAULT_STATE_FILE, device_root, inventory)

    def list(self) -> tuple[Vnpu, ...]:
        try:
            return self.hdk.vnpus(self.hdk.read())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise _state_error(self.hdk.state_file, exc) from exc

    def create(self, die: Die, template: Template, vnpu_id: int) -> Vnpu:
        try:
            with self.hdk.transaction() as state:
                return self.hdk.create(state, die, template.name, vnpu_id)
        except HdkError as exc:
            raise _refused(exc) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if not self._recorded(vnpu_id):  # the node was made but the state write failed
                files.remove_nofollow(self.hdk.node_path(vnpu_id))
            raise _state_error(self.hdk.state_file, exc) from exc

    def destroy(self, die: Die, vnpu_id: int) -> bool:
        del die
        try:
            with self.hdk.transaction() as state:
                return self.hdk.destroy(state, vnpu_id)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise _state_error(self.hdk.state_file, exc) from exc

    def check_prerequisites(self, die: Die) -> None:
        mode = self.hdk.read()["vnpuMode"]
        if mode != CONTAINER_MODE:
            raise StateError(
                f"die {die.phy_id}: the chip is in vNPU mode {mode!r}; run `npu-smi set -t vnpu-mode -d 0` (container)",
                code=ErrorCode.VNPU_MODE,
                field="vnpu-mode",
            )

    def _recorded(self, vnpu_id: int) -> bool:
        try:
            return any(v.vnpu_id == vnpu_id for v in self.list())
        except StateError:
            return True  # doubt keeps things

    def __repr__(self) -> str:
        return f"EmulatedVnpus({str(self.hdk.state_file)!r})"


def _refused(exc: HdkError) -> StateError | InvalidInput:
    if exc.code == ErrorCode.TEMPLATE_UNSUPPORTED:
        return InvalidInput(str(exc), code=exc.code, field="template")
    return StateError(
        str(exc), code=exc.code, field="vnpuID" if exc.code == ErrorCode.VNPU_ID_IN_USE else "template"
    )


def _state_error(path: Path, exc: Exception) -> Unavailable:
    return Unavailable(
        f"the emulated vNPU state {path} cannot be used: {str(exc)[:200]}",
        code=ErrorCode.VNPU_FAILED,
        field="vnpu-state",
    )
