"""The container image (Containerfile, scripts/build-image.sh): it builds here from Debian packages with no
registry, its entry points answer, the client libraries load, and it ships what it says and nothing more.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.e2e import image as img

pytestmark = [pytest.mark.root, pytest.mark.podman, pytest.mark.timeout(img.BUILD_TIMEOUT + 300)]

LIBASCENDCL = img.ROOT / "libascendcl" / "Makefile"


@pytest.fixture
def built(built_image: img.Built) -> img.Built:
    return built_image


def inspect(image: str) -> dict[str, object]:
    out = subprocess.run(
        ["podman", "image", "inspect", image], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    doc: dict[str, object] = json.loads(out)[0]
    return doc


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["flexnpu-dra", "--help"], id="flexnpu-dra"),
        pytest.param(["flexnpu-dra", "plugin", "--help"], id="flexnpu-dra-plugin"),
        pytest.param(["flexnpu-daemon", "--help"], id="flexnpu-daemon"),
        pytest.param(["flexnpu-smi", "--help"], id="flexnpu-smi"),
        pytest.param(["flexnpu-aclserver", "--help"], id="flexnpu-aclserver"),
    ],
)
def test_entry_points_answer(built: img.Built, argv: list[str]) -> None:
    proc = img.run(built.image, argv)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: {argv[0]}"), proc.stdout[:300]


def test_demo_says_why_it_does_not_run_here(built: img.Built) -> None:
    proc = img.run(built.image, ["flexnpu-dra", "demo"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "scripts/demo.sh" in proc.stderr


def test_client_libraries_load(built: img.Built) -> None:
    # The Python client (what a container's program imports), and the C library when the tree has it.
    script = (
        "import ctypes, os\n"
        "from flexnpu_client import acl\n"
        "print('python-client', callable(acl.init))\n"
        "import importlib.util\n"
        "print('flexnpu_client', importlib.util.find_spec('flexnpu_client.acl') is not None)\n"
        "so = '/usr/lib/flexnpu/libascendcl.so'\n"
        "if os.path.exists(so):\n"
        "    lib = ctypes.CDLL(so)\n"
        "    print('libascendcl', bool(lib.aclInit), bool(lib.aclrtMalloc))\n"
        "else:\n"
        "    print('libascendcl absent')\n"
    )
    proc = img.run(built.image, ["python3", "-c", script])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "python-client True"
    # The container client's own distribution (client/), when the tree has it.
    assert lines[1] == f"flexnpu_client {(img.ROOT / 'client' / 'flexnpu_client' / 'acl.py').exists()}"
    assert lines[2] == ("libascendcl True True" if LIBASCENDCL.exists() else "libascendcl absent")


def test_image_ships_no_test_doubles_and_runs_as_non_root(built: img.Built) -> None:
    script = (
        "import importlib.util, os, shutil\n"
        "print(os.getuid(), os.getgid())\n"
        "print(importlib.util.find_spec('flexnpu_testing'))\n"
        "print(shutil.which('gcc'), shutil.which('make'), shutil.which('pip'))\n"
    )
    proc = img.run(built.image, ["python3", "-c", script])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["65532 65532", "None", "None None None"]


def test_oci_labels_and_size(built: img.Built) -> None:
    doc = inspect(built.image)
    labels = doc["Labels"]
    assert isinstance(labels, dict)
    for key in ("title", "description", "version", "revision", "created", "source", "licenses", "base.name"):
        assert labels.get(f"org.opencontainers.image.{key}"), key
    assert labels["org.opencontainers.image.version"] == "0.1.0"
    assert labels["org.opencontainers.image.base.name"].startswith("localhost/flexnpu-base:bookworm-")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=img.ROOT, capture_output=True, text=True, check=False
    )
    if head.returncode == 0:
        assert labels["org.opencontainers.image.revision"] == head.stdout.strip()
    assert doc["Size"] == built.size_bytes
    print(f"image {built.image}: {built.size_bytes / 1e6:.0f} MB")
