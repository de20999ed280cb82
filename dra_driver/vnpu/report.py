"""``flexnpu-smi info`` rows for hard vNPUs (pure): template, die, ID, owner, residual state.

One row per vNPU that exists on the node (from the :class:`~dra_driver.vnpu.VnpuManager`), with
its owner from the driver's ledger (``dra_driver/vnpu/ownership.py``) and the checkpoint: a claim
that owns it, a claim that is gone (the sweep destroys it), or "made outside the driver" (kept,
and its capacity is not offered). Columns are those of ``kubeletplugin/smi.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dra_driver import templates
from dra_driver.devices import Inventory
from dra_driver.vnpu import Vnpu

__all__ = ["hard_rows"]


def hard_rows(
    vnpus: Iterable[Vnpu],
    *,
    ledger: Mapping[int, str] | None,
    claims: Mapping[str, tuple[str, str]],
    inventory: Inventory,
) -> list[dict[str, str]]:
    """``claims`` maps a claim UID with a checkpoint entry to (``namespace/name``, state)."""
    rows: list[dict[str, str]] = []
    for v in sorted(vnpus, key=lambda v: v.vnpu_id):
        die = inventory.by_phy_id(v.phy_id)
        t = (
            next(
                (x for x in templates.for_model(die.model, inventory.templates) if x.name == v.template), None
            )
            if die
            else None
        )
        owner = ledger.get(v.vnpu_id) if ledger is not None else None
        claim, state = claims.get(owner, ("-", "-")) if owner else ("-", "-")
        if ledger is None:
            residual = "? (the driver's vNPU ledger cannot be read; kept)"
        elif owner is None:
            residual = "no: made outside the driver (kept; its capacity is not offered)"
        elif owner not in claims:
            residual = (
                "in use by a container (kept)"
                if v.in_use
                else "yes: its claim is gone (the sweep destroys it)"
            )
        else:
            residual = "no"
        rows.append(
            {
                "CLAIM UID": owner or "-",
                "CLAIM": claim,
                "DEVICE": f"vnpu {v.vnpu_id} {v.template}",
                "DIE": str(v.phy_id),
                "MODE": "hard",
                "MEM(MiB) USED/QUOTA": f"-/{t.memory_mib}" if t else "-",
                "COMPUTE(%) USED/QUOTA": f"{t.aicore} AI Cores" if t else "-",
                "POLICY": "-",
                "ACLSERVER": "-",
                "ENDPOINT": v.device_node,
                "STATE": state,
                "PODS": "in use" if v.in_use else "-",
                "RESIDUAL": residual,
            }
        )
    return rows
