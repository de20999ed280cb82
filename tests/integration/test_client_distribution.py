"""The container client is its own distribution: a fresh virtualenv installs ``client/`` offline
and nothing else, imports it without the driver's dependencies, and drives a real aclserver."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexnpu_testing import aclserver_harness
from flexnpu_testing.aclserver_harness import RunningAclServer
from flexnpu_wire import clientconf

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("clientdist")
    src = work / "src"
    shutil.copytree(ROOT / "client", src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    wheels = work / "wheels"
    # the build stage of an image: a wheel, built with the build tools of this (driver) venv
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    # the application image: the wheel alone, offline (--no-index: nothing else can come in)
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-index", *map(str, wheels.glob("*.whl"))],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return py


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningAclServer]:
    with aclserver_harness.running_aclserver(
        tmp_path,
        shares=[aclserver_harness.share(0, die=9, memory=256 << 20)],
        ledger_dir=str(tmp_path / "ledger"),
    ) as srv:
        yield srv


def test_fresh_venv_holds_only_the_client(client_venv: Path) -> None:
    out = subprocess.run(
        [str(client_venv), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True
    )
    names = {line.split("==")[0].lower() for line in out.stdout.split()}
    assert "flexnpu-client" in names
    assert not names & {
        "grpcio",
        "kubernetes",
        "opentelemetry-sdk",
        "protobuf",
        "numpy",
        "flexnpu-dra-driver",
    }
    probe = (
        "import sys; from flexnpu_client import acl; import flexnpu_wire.ops;"
        " print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc','kubernetes','opentelemetry','dra_driver')))"
    )
    run = subprocess.run([str(client_venv), "-c", probe], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


def test_fresh_venv_client_uses_a_real_aclserver(
    client_venv: Path, server: RunningAclServer, tmp_path: Path
) -> None:
    conf = tmp_path / "client.conf"
    conf.write_text(clientconf.render(server.conf()))
    program = (
        "import sys; from flexnpu_client import acl\n"
        "assert acl.init(sys.argv[1]) == 0, acl.get_last_error()\n"
        "assert acl.rt.set_device(0) == 0\n"
        "free, total, ret = acl.rt.get_mem_info(acl.HBM_MEM); assert ret == 0 and total == 256 << 20\n"
        "ptr, ret = acl.rt.malloc(512 << 20, 0); assert ret == 207001, ret\n"
        "print(acl.get_last_error())\n"
        "assert acl.finalize() == 0\n"
    )
    run = subprocess.run(
        [str(client_venv), "-c", program, str(conf)], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    assert "quota" in run.stdout
    probe = subprocess.run(
        [str(client_venv.parent / "flexnpu-probe"), "--conf", str(conf)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    assert "1 vNPU(s)" in probe.stdout


def test_acl_init_returns_codes_for_missing_and_malformed_conf(client_venv: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.conf"
    bad.write_text(
        '{"version": 1, "claim_uid": "u", "token": "ab", "endpoints": {}, "shm_dir": "/x", "shares": []}'
    )
    program = (
        "import sys; from flexnpu_client import acl\n"
        "ret = acl.init(sys.argv[1]); print(ret, acl.get_last_error())\n"
        "ret = acl.init(sys.argv[2]); print(ret, acl.get_last_error())\n"
        "ptr, ret = acl.rt.malloc(10, 0); print(ret)\n"
    )
    run = subprocess.run(
        [str(client_venv), "-c", program, str(tmp_path / "missing.conf"), str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr  # nothing raised
    lines = run.stdout.splitlines()
    assert lines[0].startswith("100003 ") and "missing.conf" in lines[0]
    assert lines[1].startswith("100006 ") and "endpoints" in lines[1]
    assert lines[2] == "100001"  # not initialised
