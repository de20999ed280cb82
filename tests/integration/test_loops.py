"""Loops that cannot die silently, with the real node process.

A cleanup pass that hits a read-only CDI directory (an orphan spec it cannot delete) logs the
error, counts it in ``flexnpu_dra_loop_errors_total{loop="reconciler"}``, keeps the loop alive
(``/healthz`` and ``flexnpu-dra probe`` stay healthy) and removes the orphan once the directory is
writable again: before, the reconciler thread died and nothing was cleaned up until a restart.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import Node

ORPHAN_UID = "0badc0de-0000-4000-8000-00000000feed"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _read_only(directory: Path) -> Iterator[None]:
    """``directory`` on a read-only bind mount of itself (root ignores file modes, not mounts)."""
    subprocess.run(["mount", "--bind", str(directory), str(directory)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)], check=True)
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def _metric(port: int, name: str, *labels: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and all(lb in line for lb in labels):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _probe(port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubeletplugin.cli", "probe", "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.root
def test_read_only_cdi_dir_during_cleanup_does_not_kill_the_reconciler(
    node_factory: Callable[..., Node],
) -> None:
    port = _free_port()
    n = node_factory(FLEXNPU_METRICS_PORT=str(port), FLEXNPU_RECONCILE_PERIOD_SECONDS="1")
    orphan = n.dirs["cdi"] / f"flexnpu.io-vnpu_{ORPHAN_UID}.json"
    orphan.write_text('{"cdiVersion": "0.5.0", "kind": "flexnpu.io/vnpu", "devices": []}\n')
    with _read_only(n.dirs["cdi"]):
        n.start()
        wait_for(
            lambda: _metric(port, "flexnpu_dra_loop_errors_total", 'loop="reconciler"') >= 2,
            what="two failed removals (the loop went on after the first)",
            timeout=30,
        )
        assert orphan.exists()
        assert "could not remove orphan cdi-spec" in n.log() and "Read-only file system" in n.log()
        probe = _probe(port)
        assert probe.returncode == 0, probe.stdout + probe.stderr
        assert "reconciler: ok" in probe.stdout
        health = urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10)
        assert health.status == 200
    wait_for(
        lambda: not orphan.exists(), what="the orphan removed once the directory is writable", timeout=30
    )
    assert "removed orphan cdi-spec" in n.log()
    assert n.proc is not None and n.proc.poll() is None


def test_probe_fails_without_an_answer() -> None:
    probe = _probe(_free_port())
    assert probe.returncode == 3 and "no answer" in probe.stderr
