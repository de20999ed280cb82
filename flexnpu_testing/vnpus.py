"""Hard vNPUs as a new prepare plans them, for tests: template devices in, :class:`HardVnpu` out.

:func:`new_vnpus` goes the production way (``Inventory.allocated`` reads the allocation results,
``planning.claim_vnpus`` picks the IDs, as ``dra_driver/plan.py`` does), so a test that needs a
vNPU or its checkpoint record, or checks the planning errors, sees what a prepare would.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dra_driver.devices import Inventory
from dra_driver.vnpu.planning import HardVnpu, claim_vnpus

DRIVER = "npu.flexnpu.io"
POOL = "node"


def new_vnpus(
    results: Sequence[tuple[str, str]],
    *,
    inventory: Inventory,
    taken: Iterable[int] = (),
    claim_uid: str,
) -> tuple[HardVnpu, ...]:
    """The vNPUs a new prepare gives the allocation ``results`` (request, template device), in
    (request, device) order, with IDs avoiding ``taken`` (IDs other claims recorded)."""
    devices = inventory.allocated(
        [{"request": r, "driver": DRIVER, "pool": POOL, "device": d} for r, d in results],
        driver_name=DRIVER,
        pool_name=POOL,
        claim_uid=claim_uid,
    )
    ids = list(taken)
    return claim_vnpus(
        devices,
        recorded=None,
        others=lambda: [{"vnpuID": i} for i in ids],
        existing=tuple,
        inventory=inventory,
        claim_uid=claim_uid,
    ).vnpus
