"""Writes that cannot be torn: a full state directory and a read-only CDI directory, with real processes.

The node's state directory is a small tmpfs of its own; a filler file takes its last byte, so
the checkpoint step of a prepare or an unprepare fails with ENOSPC for real. The CDI directory is
bind-mounted read-only over itself. In each case the failing claim gets a clear error naming it
and the step (``WriteFailed``), nothing of it is left half-made, the claims the node already
serves keep working, and once the disk is writable again the kubelet's retry succeeds and the node
ends clean.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.checkpoint import CheckpointStore, ClaimState
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import NAMESPACE, NODE, Node
from tests.integration.lifecycle_helpers import (
    assert_clean,
    assert_share_works,
    claim_doc,
    pod_ref,
    share_request,
)

SHARE = [share_request()]


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


@pytest.fixture
def disk_node(node_factory: Callable[..., Node]) -> Iterator[Node]:
    n = node_factory(
        daemon=True,
        FLEXNPU_DEFAULT_MODE="both",
        FLEXNPU_DAEMON_RETRY_SECONDS="2",
        FLEXNPU_RECONCILE_PERIOD_SECONDS="1",
        FLEXNPU_RESIDUAL_GRACE_SECONDS="2",
    )
    state = n.dirs["state"]
    state.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(state))
    try:
        n.start()
        wait_for(n.devices, what="published devices")
        yield n
    finally:
        n.stop()
        subprocess.run(["umount", "-l", str(state)], check=False)


def _allocate(node: Node, name: str) -> ClaimRef:
    uid = node.create_claim(name, SHARE)
    node.scheduler.allocate(NAMESPACE, name, NODE, reserved_for=[pod_ref(f"pod-{name}")])
    return ClaimRef(NAMESPACE, uid, name)


def _prepare(node: Node, ref: ClaimRef) -> Any:
    assert node.kubelet is not None
    return node.kubelet.prepare([ref])[ref.uid]


def _unprepare(node: Node, ref: ClaimRef) -> str:
    assert node.kubelet is not None
    return node.kubelet.unprepare([ref])[ref.uid]


def _fill(directory: Path) -> Path:
    """Take every free byte of ``directory``'s filesystem; the filler file's path."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        chunk = b"\0" * 4096
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    finally:
        os.close(fd)
    return filler


def _nothing_of(node: Node, ref: ClaimRef) -> None:
    assert not any(ref.uid in p.name for p in node.cdi_specs())
    assert not (node.dirs["run"] / "claims" / ref.uid).exists()
    assert node.daemon is not None
    with node.daemon.client(timeout=10) as c:
        assert all(e.entity_id != ref.uid for e in c.list())
    assert CheckpointStore(node.dirs["state"] / "checkpoint.json").get(ref.uid) is None


@pytest.mark.root
def test_full_state_dir_fails_the_prepare_cleanly_and_the_node_serves_on(disk_node: Node) -> None:
    n = disk_node
    a = _allocate(n, "a")
    assert _prepare(n, a).error == ""
    a_pid = assert_share_works(n, a.uid)
    filler = _fill(n.dirs["state"])

    b = _allocate(n, "b")
    res = _prepare(n, b)
    assert (
        res.devices == () and b.uid in res.error and "WriteFailed" in res.error and "checkpoint" in res.error
    )
    _nothing_of(n, b)
    (dev,) = claim_doc(n, "b")["status"]["devices"]  # kubectl describe says why
    assert (dev["conditions"][0]["status"], dev["conditions"][0]["reason"]) == ("False", "WriteFailed")
    assert assert_share_works(n, a.uid) == a_pid  # the claim it serves is untouched

    filler.unlink()
    assert _prepare(n, b).error == ""  # the kubelet's retry
    assert_share_works(n, b.uid)
    assert_clean(n, {a.uid, b.uid})


@pytest.mark.root
def test_full_state_dir_fails_the_unprepare_and_keeps_the_claim_whole(disk_node: Node) -> None:
    n = disk_node
    a, b = _allocate(n, "a"), _allocate(n, "b")
    assert _prepare(n, a).error == "" and _prepare(n, b).error == ""
    b_pid = assert_share_works(n, b.uid)
    filler = _fill(n.dirs["state"])

    err = _unprepare(n, b)
    assert b.uid in err and "WriteFailed" in err
    entry = CheckpointStore(n.dirs["state"] / "checkpoint.json").get(b.uid)
    assert entry is not None and entry.state == ClaimState.PREPARE_COMPLETED  # nothing was undone
    assert assert_share_works(n, b.uid) == b_pid
    assert_share_works(n, a.uid)

    filler.unlink()
    assert _unprepare(n, b) == ""
    _nothing_of(n, b)
    assert_clean(n, {a.uid})


@pytest.mark.root
def test_read_only_cdi_dir_fails_the_prepare_and_rolls_it_back(disk_node: Node) -> None:
    n = disk_node
    a = _allocate(n, "a")
    assert _prepare(n, a).error == ""
    a_pid = assert_share_works(n, a.uid)
    cdi = n.dirs["cdi"]
    a_spec = json.loads(next(p for p in n.cdi_specs() if a.uid in p.name).read_text())
    _mount("--bind", str(cdi), str(cdi))
    try:
        _mount("-o", "remount,bind,ro", str(cdi))
        b = _allocate(n, "b")
        res = _prepare(n, b)
        assert b.uid in res.error and "cdi-spec" in res.error and "WriteFailed" in res.error
        _nothing_of(n, b)  # the aclserver it started and its client.conf were rolled back
        assert assert_share_works(n, a.uid) == a_pid
    finally:
        subprocess.run(["umount", str(cdi)], check=True)
    assert json.loads(next(p for p in n.cdi_specs() if a.uid in p.name).read_text()) == a_spec
    assert _prepare(n, b).error == ""
    assert_share_works(n, b.uid)
    assert_clean(n, {a.uid, b.uid})
