"""Leaving the node: what a clean stop of the last instance on the node removes, and what it keeps.

A clean stop of the last instance (an uninstall, not a rolling update, whose surge pod still
serves) withdraws this node's ResourceSlices at once (the kubelet would only after 30 s), and
removes the control link when nothing is prepared here any more. On doubt (another instance may
answer, the daemon does not, a claim is recorded) everything stays. What ``flexnpu-smi uninstall``
removes on top is ``kubeletplugin/uninstall.py``.
"""

from __future__ import annotations

import logging
from typing import Protocol

from dra_driver import netlink
from dra_driver.checkpoint import CheckpointStore
from dra_driver.daemon_api.client import DaemonClient
from dra_driver.errors import FlexNPUError

__all__ = ["Leaving"]

log = logging.getLogger("flexnpu.node")


class Serving(Protocol):
    """The helper's view of it (``dra_kubeletplugin.Helper``), after its stop."""

    def other_instances(self, *, timeout: float = 2.0) -> list[str]: ...

    def withdraw_resources(self) -> int: ...


class Leaving:
    """:meth:`leave` once, after the helper stopped serving."""

    def __init__(
        self, helper: Serving, *, control_link: str, store: CheckpointStore, daemon: DaemonClient | None
    ) -> None:
        self.helper = helper
        self.control_link = control_link
        self.store = store
        self.daemon = daemon

    def leave(self) -> None:
        others = self.helper.other_instances()
        if others:
            log.info(
                "stop: %d other instance(s) serve this node (%s); slices stay", len(others), ", ".join(others)
            )
            return
        try:
            withdrawn = self.helper.withdraw_resources()
            log.info("stop: last instance on the node; withdrew %d ResourceSlice(s)", withdrawn)
        except FlexNPUError as err:
            log.warning("stop: could not withdraw the slices (the kubelet removes them 30 s after): %s", err)
        if not self.control_link or not self._nothing_prepared():
            return
        try:
            if netlink.remove_link(self.control_link):
                log.info("stop: nothing prepared on the node; removed the control link %s", self.control_link)
        except FlexNPUError as err:
            log.warning("stop: could not remove the control link %s: %s", self.control_link, err)

    def _nothing_prepared(self) -> bool:
        try:
            if self.store.read().claims:
                return False
            return self.daemon is None or not self.daemon.list()
        except FlexNPUError as err:
            log.info("stop: keeping the control link, cannot prove nothing is prepared: %s", err)
            return False
