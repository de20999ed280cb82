"""``flexnpu-smi uninstall``: remove what the driver leaves on a node after ``helm uninstall``.

What stays after the DaemonSets are deleted, and why (docs/uninstall.md): the node process
withdraws its slices and removes the control link on a clean stop when nothing is prepared
(``kubeletplugin/node.py``); the rest is state a restart must find again, so only an operator who
means to remove the driver removes it, with this command:

* the per-die compute ledgers (``<shm-dir>/.ledger``) and the empty shm root;
* the C client library copy the plugin's init container made (``<state-dir>/client``);
* the daemon's registry (``<state-dir>/daemon``), the checkpoint (``<state-dir>/checkpoint.json``,
  only with no claim in it) and the emulated device root (``--device-root``, never ``/``);
* the kubelet plugin dir's call-serialisation lock (``serialize.lock``) and the empty plugin dir;
* the per-instance readiness records and the empty run dirs (``<run-dir>``);
* the control link and its address (``--control-link``);
* this node's ResourceSlices of this driver, when the API answers.

It refuses while a claim is recorded in the checkpoint or the daemon runs an aclserver, and when
the daemon cannot be asked (an aclserver may still run): ``--force`` removes anyway. Without
``--yes`` it only lists what it would remove. Symlinks are removed as links, never followed.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from controller.kube import Kube
from dra_driver import netlink
from dra_driver.checkpoint import CheckpointStore
from dra_driver.config import Config
from dra_driver.daemon_api.client import DaemonClient
from dra_driver.errors import FlexNPUError


@dataclass(frozen=True, slots=True)
class Item:
    what: str
    path: Path | None = None  # None: not a file (the link, the slices)


def plan(cfg: Config) -> list[Item]:
    """What would be removed, in order (pure: paths from the configuration only)."""
    p = cfg.paths
    items = [
        Item("per-die compute ledgers", p.shm_root / ".ledger"),
        Item("client library copy", p.state_dir / "client"),
        Item("daemon registry", p.state_dir / "daemon"),
        Item("checkpoint (no claims)", p.checkpoint_file),
    ]
    if p.device_root != Path("/"):
        items.append(Item("emulated device root", p.device_root))
    items += [
        Item("call-serialisation lock", cfg.plugin_dir / "serialize.lock"),
        Item("readiness records", p.run_dir / "plugins"),
        Item("claim config dir", p.run_dir / "claims"),
        Item("aclserver logs", p.run_dir / "aclservers"),
    ]
    if cfg.control_link:
        items.append(Item(f"control link {cfg.control_link} and its address {cfg.control_link_cidr}"))
    items.append(Item(f"ResourceSlices of {cfg.driver_name} on node {cfg.node_name}"))
    return items


def blockers(cfg: Config, daemon: DaemonClient | None) -> list[str]:
    """Why removing now could take something alive ([] when nothing is prepared)."""
    found = []
    store_path = cfg.paths.checkpoint_file
    if store_path.exists():
        try:
            claims = CheckpointStore(store_path).read().claims
        except FlexNPUError as err:
            return [f"the checkpoint cannot be read ({err})"]
        found += [f"claim {uid} is prepared ({e.namespace}/{e.name})" for uid, e in sorted(claims.items())]
    if daemon is not None:
        try:
            found += [f"aclserver {e.entity_id} runs" for e in daemon.list()]
        except FlexNPUError as err:
            found.append(f"flexnpu-daemon does not answer, an aclserver may still run ({err})")
    return found


def run(cfg: Config, kube: Kube, daemon: DaemonClient | None, *, yes: bool, force: bool, out: TextIO) -> int:
    """List (or with ``yes`` remove) the leftovers; 0 done, 1 refused or a removal failed."""
    stopping = blockers(cfg, daemon)
    for reason in stopping:
        out.write(f"{'ignored (--force)' if force else 'refusing'}: {reason}\n")
    if stopping and not force:
        out.write("nothing removed: unprepare the claims (delete their pods) first, or use --force\n")
        return 1
    failed = 0
    for item in plan(cfg):
        if not yes:
            out.write(f"would remove {item.what}{f': {item.path}' if item.path else ''}\n")
            continue
        try:
            done = _remove(cfg, kube, item)
        except (OSError, FlexNPUError) as err:
            out.write(f"failed to remove {item.what}: {err}\n")
            failed += 1
            continue
        out.write(
            f"{'removed' if done else 'already absent'}: {item.what}{f' ({item.path})' if item.path else ''}\n"
        )
    if yes:
        for parent in (cfg.paths.shm_root, cfg.plugin_dir, cfg.paths.run_dir, cfg.paths.state_dir):
            _remove_if_empty(parent, out)
    else:
        out.write("dry run: nothing removed (add --yes)\n")
    return 1 if failed else 0


def _remove(cfg: Config, kube: Kube, item: Item) -> bool | int:
    if item.path is not None:
        return _remove_path(item.path)
    if item.what.startswith("control link"):
        return netlink.remove_link(cfg.control_link)
    existing, _ = kube.list_slices(driver=cfg.driver_name, node=cfg.node_name)
    for s in existing:
        meta = s["metadata"]
        kube.delete_slice(meta["name"], uid=meta["uid"], resource_version=meta["resourceVersion"])
    return len(existing)


def _remove_path(path: Path) -> bool:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # removes symlinks inside as links (never follows them)
    else:
        os.unlink(path)  # a symlink itself, never its target
    return True


def _remove_if_empty(path: Path, out: TextIO) -> None:
    try:
        path.rmdir()
    except FileNotFoundError:
        return
    except OSError:
        left = sorted(p.name for p in path.iterdir())[:10] if path.is_dir() else []
        out.write(f"kept {path}: not empty ({', '.join(left)})\n")
        return
    out.write(f"removed: empty {path}\n")
