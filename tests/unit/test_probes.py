"""The DaemonSets' exec probes fail, with one clear line, when the process they ask does not answer.

That they pass against live processes is shown by tests/e2e/test_daemonsets_podman.py, which runs them as the
kubelet would (``podman exec`` with the container's environment).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def probe(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLEXNPU_")}
    return subprocess.run(
        [sys.executable, "-m", "dra_driver.probes", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **env},
        check=False,
    )


def test_plugin_probe_names_the_registration_socket_that_does_not_answer(tmp_path: Path) -> None:
    env = {
        "FLEXNPU_NODE_NAME": "n1",
        "FLEXNPU_POD_UID": "abc",
        "FLEXNPU_KUBELET_REGISTRY_DIR": str(tmp_path / "reg"),
        "FLEXNPU_KUBELET_PLUGINS_DIR": str(tmp_path / "plugins"),
    }
    proc = probe(["plugin"], env)
    assert proc.returncode == 1
    assert proc.stderr.startswith("probe plugin: registration socket ")
    assert str(tmp_path / "reg" / "npu.flexnpu.io-abc-reg.sock") in proc.stderr


def test_plugin_probe_fails_when_the_socket_exists_but_nothing_serves(tmp_path: Path) -> None:
    reg = tmp_path / "npu.flexnpu.io-reg.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(reg))  # a stale socket file: bound, never listening
        proc = probe(["plugin"], {"FLEXNPU_NODE_NAME": "n1", "FLEXNPU_KUBELET_REGISTRY_DIR": str(tmp_path)})
    assert proc.returncode == 1 and "did not answer GetInfo" in proc.stderr


def test_daemon_probe_names_its_socket(tmp_path: Path) -> None:
    sock = tmp_path / "daemon.sock"
    proc = probe(["daemon"], {"FLEXNPU_DAEMON_SOCKET": str(sock)})
    assert proc.returncode == 1
    assert f"daemon socket {sock} did not answer Health" in proc.stderr


@pytest.mark.parametrize("args", [[], ["kubelet"], ["plugin", "daemon"]])
def test_usage(args: list[str]) -> None:
    proc = probe(args, {})
    assert proc.returncode == 2 and "usage:" in proc.stderr
