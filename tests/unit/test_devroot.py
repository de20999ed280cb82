"""The emulated device root: every path the CDI spec references exists, as the right kind of file."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver.discovery import emulated, node_files
from flexnpu_testing import devroot, inventories


def tree(root: Path) -> set[str]:
    return {"/" + str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize(
    ("name", "davinci"),
    [
        pytest.param("two-chip-910b3.yaml", [0, 1], id="demo"),
        pytest.param("a3-one-module.yaml", [0, 1], id="a3"),
        pytest.param("eight-910b4.yaml", list(range(8)), id="eight"),
    ],
)
def test_builds_every_referenced_path(tmp_path: Path, name: str, davinci: list[int]) -> None:
    inv = emulated.load_inventory(inventories.path(name))
    root = tmp_path / "root"
    devroot.build_device_root(root, inv)
    nodes = [f"/dev/davinci{n}" for n in davinci] + list(node_files.SHARED_DEVICE_NODES)
    assert list(devroot.device_paths(inv)) == nodes
    for node in nodes:
        mode = (root / node.lstrip("/")).stat().st_mode
        # Tests run as root: real character devices with /dev/null's numbers.
        assert stat.S_ISCHR(mode), node
        rdev = (root / node.lstrip("/")).stat().st_rdev
        assert (os.major(rdev), os.minor(rdev)) == devroot.NULL_DEVICE
        assert stat.S_IMODE(mode) == 0o666, node
    for directory in node_files.DRIVER_DIRS:
        assert (root / directory.lstrip("/")).is_dir(), directory
    for file in node_files.DRIVER_FILES:
        assert (root / file.lstrip("/")).is_file(), file
    assert os.access(root / "usr/local/bin/npu-smi", os.X_OK)
    assert f"Version={inv.driver_version}" in (root / "usr/local/Ascend/driver/version.info").read_text()
    assert set(node_files.DRIVER_MOUNTS) == set(node_files.DRIVER_DIRS) | set(node_files.DRIVER_FILES)
    dev_entries = {p for p in tree(root) if p.startswith("/dev/")}
    assert dev_entries == set(nodes)  # nothing else under dev/


def test_emulated_node_can_be_opened(tmp_path: Path) -> None:
    inv = emulated.load_inventory(inventories.path(inventories.DEMO))
    devroot.build_device_root(tmp_path, inv)
    with (tmp_path / "dev/davinci0").open("rb") as dev:
        assert dev.read(16) == b""  # /dev/null semantics


def test_idempotent_and_keeps_existing_content(tmp_path: Path) -> None:
    inv = emulated.load_inventory(inventories.path(inventories.DEMO))
    devroot.build_device_root(tmp_path, inv)
    before = tree(tmp_path)
    version = tmp_path / "usr/local/Ascend/driver/version.info"
    version.write_text("Version=custom\n")
    devroot.build_device_root(tmp_path, inv)
    assert tree(tmp_path) == before
    assert version.read_text() == "Version=custom\n"


def test_growing_inventory_adds_nodes(tmp_path: Path) -> None:
    small = emulated.load_inventory(inventories.path(inventories.DEMO))
    large = emulated.load_inventory(inventories.path("eight-910b4.yaml"))
    devroot.build_device_root(tmp_path, small)
    devroot.build_device_root(tmp_path, large)
    assert {f"/dev/davinci{n}" for n in range(8)} <= tree(tmp_path)


def test_falls_back_to_regular_files_without_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    inv = emulated.load_inventory(inventories.path(inventories.DEMO))
    devroot.build_device_root(tmp_path, inv)
    for node in devroot.device_paths(inv):
        assert (tmp_path / node.lstrip("/")).is_file(), node


def test_falls_back_when_mknod_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "mknod", refuse)
    inv = emulated.load_inventory(inventories.path(inventories.DEMO))
    devroot.build_device_root(tmp_path, inv)
    assert (tmp_path / "dev/davinci_manager").is_file()


def test_node_file_tables_are_absolute_and_unique() -> None:
    for table in (node_files.SHARED_DEVICE_NODES, node_files.DRIVER_MOUNTS):
        assert all(p.startswith("/") and not p.endswith("/") for p in table)
        assert len(set(table)) == len(table)
    assert all(p.startswith("/dev/") for p in node_files.SHARED_DEVICE_NODES)
    assert node_files.die_device_node(3) == "/dev/davinci3"


def test_command_builds_the_root_in_a_real_process(tmp_path: Path) -> None:
    root = tmp_path / "devroot"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flexnpu_testing.devroot",
            str(inventories.path("a3-one-module.yaml")),
            str(root),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "2 die(s)" in done.stdout
    assert stat.S_ISCHR((root / "dev/davinci1").stat().st_mode)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        pytest.param([], 2, "usage:", id="no-args"),
        pytest.param(
            ["/nonexistent/inventory.yaml", "/tmp/x"], 1, "cannot read inventory file", id="missing-inventory"
        ),
    ],
)
def test_command_errors(args: list[str], code: int, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert devroot.main(args) == code
    assert message in capsys.readouterr().err


# -- production use: `flexnpu-dra plugin --build-device-root` ------------------------------------


def test_symlink_below_the_root_is_refused_not_followed(tmp_path: Path) -> None:
    from dra_driver.errors import ErrorCode, InvalidInput

    inv = emulated.load_inventory(inventories.path("two-chip-910b3.yaml"))
    outside = tmp_path / "outside"
    outside.mkdir()
    for planted in ("dev", "usr/local/Ascend/driver/version.info"):
        root = tmp_path / f"root-{planted.replace('/', '-')}"
        link = root / planted
        link.parent.mkdir(parents=True)
        link.symlink_to(outside / "target")
        with pytest.raises(InvalidInput) as err:
            devroot.build_device_root(root, inv)
        assert err.value.code == ErrorCode.INVALID_PATH and str(link) in str(err.value)
        assert list(outside.iterdir()) == []  # nothing was written through the link


def _plugin(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXNPU_")}
    return subprocess.run(
        [sys.executable, "-m", "kubeletplugin.cli", "plugin", "--node-name", "n1", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--build-device-root", "true"], "needs --inventory", id="no-inventory"),
        pytest.param(
            ["--build-device-root", "true", "--inventory", "INV", "--device-root", "/"],
            "other than /",
            id="host-root",
        ),
    ],
)
def test_plugin_flag_refuses_before_touching_anything(tmp_path: Path, args: list[str], message: str) -> None:
    inv = str(inventories.path("two-chip-910b3.yaml"))
    proc = _plugin([inv if a == "INV" else a for a in args], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "build-device-root" in proc.stderr
