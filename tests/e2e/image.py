"""The FlexNPU image for tests: built once per session by scripts/build-image.sh, run with plain podman.

The image lives in podman's default storage, so its base (made from Debian packages) and its layers are reused
by the next run on the same machine; a warm rebuild takes seconds. Runs use runc with lowered ulimits, the only
settings rootful podman accepts on this kind of machine (runc, explicit ulimits; see flexnpu_testing/podman.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-image.sh"
IMAGE = f"localhost/flexnpu-dra-driver:test-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:10]}"
"""One tag per checkout: podman's image store is global, and two checkouts testing at once must not run each
other's image."""
RUN_FLAGS = ("--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
BUILD_TIMEOUT = 1200


@dataclass(frozen=True)
class Built:
    image: str
    size_bytes: int
    log: str


def build() -> Built:
    """Run scripts/build-image.sh; its last stdout line is ``<image> <size>``."""
    if shutil.which("podman") is None:
        raise RuntimeError("podman is not installed (scripts/test.sh installs it as root)")
    env = {**os.environ, "FLEXNPU_IMAGE": IMAGE}
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"build-image.sh failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}")
    name, size = proc.stdout.strip().splitlines()[-1].split()
    return Built(name, int(size), proc.stderr)


def run(
    image: str,
    argv: Sequence[str],
    *,
    flags: Sequence[str] = ("--network=none",),
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``podman run --rm`` one command in the image; returns the finished process."""
    env_flags = [f"--env={k}={v}" for k, v in (env or {}).items()]
    cmd = ["podman", "run", "--rm", *RUN_FLAGS, *flags, *env_flags, image, *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
