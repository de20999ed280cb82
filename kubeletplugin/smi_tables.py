"""What ``flexnpu-smi info`` prints, rendered (pure): the columns, each cell, the rows and the table.

This module owns the text of ``flexnpu-smi info``: which columns there are, how a claim's quotas,
usage, aclserver, cgroup bounds, endpoint and state read, and how rows line up. It reads nothing and
asks nobody: ``kubeletplugin/smi.py`` gathers the checkpoint, the daemon's entities and the API's view
and hands them here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from dra_driver.checkpoint import ClaimEntry
from dra_driver.daemon_api.values import EntityInfo, ShareUsage

MIB = 1024 * 1024

COLUMNS = (
    "CLAIM UID", "CLAIM", "VNPU", "DEVICE", "DIE", "MODE", "MEM(MiB) USED/QUOTA", "COMPUTE(%) USED/QUOTA",
    "POLICY", "PRIORITY", "ACLSERVER", "HOST MEM(MiB) USED/MAX", "TASKS USED/MAX", "CPU WEIGHT", "ENDPOINT", "STATE",
    "PODS", "RESIDUAL",
)  # fmt: skip
"""The ACLSERVER columns come from the daemon; HOST MEM, TASKS and CPU WEIGHT are the aclserver's own
cgroup's figures (``unbounded`` when it runs in the daemon's cgroup)."""


def render_table(rows: Sequence[Mapping[str, str]], columns: Sequence[str]) -> str:
    """Left-aligned columns separated by two spaces. Pure."""
    widths = [max([len(c)] + [len(r[c]) for r in rows]) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(r[c].ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def usage_cells(usage: ShareUsage | None) -> tuple[str, str]:
    """(memory used/quota in MiB, compute used/quota in %) of one vNPU; ``-`` for unknown. Pure."""
    if usage is None:
        return "-", "-"
    used = "-" if usage.memory_used_bytes < 0 else str(usage.memory_used_bytes // MIB)
    busy = "-" if usage.compute_used_percent < 0 else str(usage.compute_used_percent)
    quota = "-" if usage.share.memory_only else str(usage.share.compute_percent)
    return f"{used}/{usage.share.memory_bytes // MIB}", f"{busy}/{quota}"


def aclserver_cell(ent: EntityInfo | None) -> str:
    if ent is None:
        return "-"
    notes = [f"restarts {ent.restarts}"] if ent.restarts else []
    if ent.oom_kills > 0:
        notes.append(f"OOM kills {ent.oom_kills}")
    return f"{ent.pid or '-'} {ent.state}" + (f" ({', '.join(notes)})" if notes else "")


def bounds_cells(ent: EntityInfo | None) -> dict[str, str]:
    """The aclserver's cgroup figures: host memory and tasks used/max, CPU weight. Pure."""
    keys = ("HOST MEM(MiB) USED/MAX", "TASKS USED/MAX", "CPU WEIGHT")
    if ent is None:
        return dict.fromkeys(keys, "-")
    if not ent.cgroup:
        return dict.fromkeys(keys, "unbounded")

    def pair(used: int, limit: int, unit: int = 1) -> str:
        return f"{used // unit if used >= 0 else '-'}/{limit // unit if limit >= 0 else 'max'}"

    weight = str(ent.cpu_weight) if ent.cpu_weight >= 0 else "-"
    return dict(
        zip(
            keys,
            (
                pair(ent.memory_current_bytes, ent.memory_max_bytes, MIB),
                pair(ent.tasks_current, ent.tasks_max),
                weight,
            ),
            strict=True,
        )
    )


def state_cell(entry: ClaimEntry, ent: EntityInfo | None, *, shares: bool, daemon_known: bool) -> str:
    """The claim's state: the checkpoint's, unless its aclserver is not serving (then that). Pure."""
    if not shares or not daemon_known or str(entry.state) != "PrepareCompleted":
        return str(entry.state)
    if ent is None:
        return "AclserverMissing"
    return str(entry.state) if str(ent.state) == "Running" else f"AclserverDown ({ent.state})"


def endpoint_cell(ent: EntityInfo | None) -> str:
    if ent is None or not ent.endpoints.tcp_port:
        return "-"
    return f"{ent.endpoints.tcp_host}:{ent.endpoints.tcp_port}"


def info_rows(
    entries: Mapping[str, ClaimEntry],
    entities: Mapping[str, EntityInfo],
    api_view: Callable[[ClaimEntry], tuple[str, str]],
    *,
    daemon_known: bool = True,
) -> list[dict[str, str]]:
    """One row per vNPU (by virtual id) and per whole die; then the daemon's orphan aclservers.

    A claim's shares on one die are told apart by their virtual ids (the daemon's ``Share``), so
    two vNPUs of one claim on one die show their own usage. ``api_view(entry)`` gives the PODS and
    RESIDUAL cells. ``daemon_known``: the daemon answered, so a claim it does not list has no
    aclserver (STATE says so).
    """
    rows: list[dict[str, str]] = []
    for uid, entry in sorted(entries.items()):
        pods, residual = api_view(entry)
        ent = entities.get(uid)
        unused = sorted(ent.shares, key=lambda u: u.share.virtual_id) if ent else []
        for d in entry.dies:
            phy, mode = d.phy, str(d.mode)
            usage = None
            if mode != "whole":
                usage = next((u for u in unused if u.share.die_phy_id == phy), None)
                if usage is not None:
                    unused.remove(usage)
            mem, compute = usage_cells(usage)
            rows.append(
                {
                    "CLAIM UID": uid,
                    "CLAIM": f"{entry.namespace}/{entry.name}",
                    "VNPU": str(usage.share.virtual_id) if usage is not None else "-",
                    "DEVICE": d.device,
                    "DIE": str(phy),
                    "MODE": mode,
                    "MEM(MiB) USED/QUOTA": mem,
                    "COMPUTE(%) USED/QUOTA": compute,
                    "POLICY": d.policy or "-",
                    "PRIORITY": (usage.share.priority or "normal") if usage is not None else "-",
                    "ACLSERVER": aclserver_cell(ent) if mode != "whole" else "-",
                    **(bounds_cells(ent) if mode != "whole" else bounds_cells(None)),
                    "ENDPOINT": endpoint_cell(ent) if mode != "whole" else "-",
                    "STATE": state_cell(entry, ent, shares=mode != "whole", daemon_known=daemon_known),
                    "PODS": pods,
                    "RESIDUAL": residual,
                }
            )
    for uid, ent in sorted(entities.items()):
        if uid in entries:
            continue
        for usage in sorted(ent.shares, key=lambda u: u.share.virtual_id):
            mem, compute = usage_cells(usage)
            rows.append(
                {
                    "CLAIM UID": uid,
                    "CLAIM": f"{ent.namespace}/{ent.name}",
                    "VNPU": str(usage.share.virtual_id),
                    "DEVICE": "-",
                    "DIE": str(usage.share.die_phy_id),
                    "MODE": "soft",
                    "MEM(MiB) USED/QUOTA": mem,
                    "COMPUTE(%) USED/QUOTA": compute,
                    "POLICY": usage.share.policy,
                    "PRIORITY": usage.share.priority or "normal",
                    "ACLSERVER": aclserver_cell(ent),
                    **bounds_cells(ent),
                    "ENDPOINT": endpoint_cell(ent),
                    "STATE": "-",
                    "PODS": "-",
                    "RESIDUAL": "yes: orphan aclserver (no checkpoint entry)",
                }
            )
    return rows


# --- what the tool looks at ----------------------------------------------------------------------
