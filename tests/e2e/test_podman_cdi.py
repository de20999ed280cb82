"""Podman 4.3.1 as the real CDI consumer of the specs the driver writes.

Whole dies and soft shares written with :mod:`dra_driver.cdi`, a whole die prepared by the
real node process, the spec versions podman rejects, and the harness's network namespace mode.
Each test runs busybox in an isolated podman instance (``flexnpu_testing.podman``).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dra_driver import cdi, discovery
from dra_driver.devices import Inventory
from dra_driver.discovery import node_files
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_testing.devroot import NULL_DEVICE, build_device_root
from flexnpu_testing.podman import UNRESOLVABLE, Podman
from flexnpu_testing.waiting import wait_for
from kubeletplugin.prepare import CONTAINER_CONF, CONTAINER_SHM
from tests.e2e.conftest import podman_unavailable
from tests.integration.conftest import INVENTORIES, NAMESPACE, NODE, Node

pytestmark = [pytest.mark.podman, pytest.mark.root]

KIND = cdi.Kind.parse("flexnpu.io/vnpu")
CHAR_NULL = f"char {NULL_DEVICE[0]:x}:{NULL_DEVICE[1]:x}"  # busybox stat %t:%T prints hex
WHOLE = [{"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}]


@dataclass
class Probe:
    """What a container saw: device node kinds, /dev entries, environment, mounts."""

    nodes: dict[str, str] = field(default_factory=dict)  # path -> "char 1:3" | "other" | "absent"
    dev: set[str] = field(default_factory=set)
    env: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, list[str]] = field(default_factory=dict)  # mount point -> options
    other: list[str] = field(default_factory=list)


def probe_script(paths: Sequence[str], extra: str = "") -> str:
    """A shell script printing tagged lines for :func:`parse_probe`, then running ``extra``."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    return "\n".join(
        [
            f"for p in {quoted}; do",
            '  if [ -c "$p" ]; then stat -c "node %n char %t:%T" "$p";',
            '  elif [ -e "$p" ]; then echo "node $p other"; else echo "node $p absent"; fi',
            "done",
            'for d in /dev/*; do echo "dev ${d#/dev/}"; done',
            'env | while read -r line; do echo "env $line"; done',
            'while read -r src mnt fs opts rest; do echo "mount $mnt $opts"; done < /proc/mounts',
            extra,
        ]
    )


def parse_probe(stdout: str) -> Probe:
    probe = Probe()
    for line in stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "node":
            path, _, kind = rest.partition(" ")
            probe.nodes[path] = kind
        elif tag == "dev":
            probe.dev.add(rest)
        elif tag == "env" and "=" in rest:
            k, _, v = rest.partition("=")
            probe.env[k] = v
        elif tag == "mount":
            mnt, _, opts = rest.partition(" ")
            probe.mounts[mnt] = opts.split(",")
        else:
            probe.other.append(line)
    return probe


def run_ok(podman: Podman, cdi_ids: Sequence[str], spec_dir: Path, command: str) -> Probe:
    res = podman.run(cdi_ids=cdi_ids, cdi_spec_dir=spec_dir, command=command)
    assert res.returncode == 0, f"podman rc {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return parse_probe(res.stdout)


def load(inventory: str) -> Inventory:
    return discovery.from_config(inventory=INVENTORIES / inventory, npu_smi="npu-smi").discover()


def whole_die_spec(inv: Inventory, phy: int, uid: str, device_root: Path) -> cdi.Spec:
    """The shape the kubelet plugin writes for one whole die (kubeletplugin/prepare.py)."""
    die = inv.by_phy_id(phy)
    assert die is not None
    device = cdi.CDIDevice(
        cdi.device_name(uid, die.whole_device_name),
        cdi.whole_die_edits([die.device_node], device_root=device_root),
    )
    shared = cdi.shared_edits(
        node_files.SHARED_DEVICE_NODES,
        node_files.DRIVER_MOUNTS,
        device_root=device_root,
        env={"FLEXNPU_CLAIM_UID": uid, "FLEXNPU_PHYSICAL_IDS": str(phy)},
    )
    return cdi.Spec(kind=KIND, devices=(device,), edits=shared)


@pytest.mark.parametrize(
    ("inventory", "phy"),
    [
        pytest.param("a3-one-module.yaml", 1, id="a3-die-1-of-2"),
        pytest.param("eight-910b4.yaml", 5, id="910b4-die-5-of-8"),
    ],
)
def test_whole_die_spec_injects_only_the_claimed_die(
    podman: Podman, tmp_path: Path, inventory: str, phy: int
) -> None:
    inv = load(inventory)
    devroot, cdi_dir = tmp_path / "devroot", tmp_path / "cdi"
    cdi_dir.mkdir()
    build_device_root(devroot, inv)
    uid = str(uuid.uuid4())
    spec = whole_die_spec(inv, phy, uid, devroot)
    path = cdi.write_spec(cdi_dir / cdi.spec_file_name(spec.kind, uid), spec, uid)
    assert path.name == f"flexnpu.io-vnpu_{uid}.json"
    assert json.loads(path.read_text())["cdiVersion"] == "0.5.0"  # deviceNode hostPath needs 0.5.0
    cdi_id = cdi.qualified_id(KIND, spec.devices[0].name)
    assert cdi_id == f"flexnpu.io/vnpu={uid}-npu-{phy}"

    others = [d.device_node for d in inv.dies if d.phy_id != phy]
    claimed = f"/dev/davinci{phy}"
    write = f"echo probe > {claimed} && echo write-ok"
    probe = run_ok(
        podman,
        [cdi_id],
        cdi_dir,
        probe_script([claimed, *node_files.SHARED_DEVICE_NODES, *others], extra=write),
    )

    assert probe.nodes[claimed] == CHAR_NULL
    for shared in node_files.SHARED_DEVICE_NODES:
        assert probe.nodes[shared] == CHAR_NULL, shared
    for other in others:
        assert probe.nodes[other] == "absent", other
    assert {d for d in probe.dev if d.startswith("davinci")} == {f"davinci{phy}", "davinci_manager"}
    assert probe.env["FLEXNPU_CLAIM_UID"] == uid
    assert probe.env["FLEXNPU_PHYSICAL_IDS"] == str(phy)
    assert "write-ok" in probe.other  # the device cgroup lets the container use its node
    for mount in node_files.DRIVER_MOUNTS:
        assert "ro" in probe.mounts[mount], mount


def test_soft_share_spec_mounts_conf_read_only_and_shm_read_write(podman: Podman, tmp_path: Path) -> None:
    uid = str(uuid.uuid4())
    conf_dir, shm_dir, cdi_dir = tmp_path / "claims" / uid, tmp_path / "shm" / uid, tmp_path / "cdi"
    for d in (conf_dir, shm_dir, cdi_dir):
        d.mkdir(parents=True)
    conf_text = f"claim_uid = {uid}\nendpoint = unix:{CONTAINER_SHM}/ctl.sock\n"
    (conf_dir / "client.conf").write_text(conf_text)
    (shm_dir / "host-wrote").write_text("from-host\n")
    # the shape kubeletplugin/prepare.py writes for a soft share: no device node
    device = cdi.CDIDevice(cdi.device_name(uid, "vnpu-0-s1"), cdi.Edits(env=("FLEXNPU_VNPU_0=vnpu-0",)))
    shared = cdi.Edits(
        env=(f"FLEXNPU_CLAIM_UID={uid}", f"FLEXNPU_CONF={CONTAINER_CONF}", "FLEXNPU_VISIBLE_VNPUS=0"),
        mounts=(
            cdi.Mount(str(conf_dir / "client.conf"), CONTAINER_CONF, ("ro", "nosuid", "nodev", "rbind")),
            cdi.Mount(str(shm_dir), CONTAINER_SHM, ("rw", "nosuid", "nodev", "rbind")),
        ),
    )
    spec = cdi.Spec(kind=KIND, devices=(device,), edits=shared)
    cdi.write_spec(cdi_dir / cdi.spec_file_name(spec.kind, uid), spec, uid)
    extra = "\n".join(
        [
            'cat "$FLEXNPU_CONF" | while read -r line; do echo "conf $line"; done',
            f"echo tampered >> {CONTAINER_CONF} || echo conf-write-refused",
            f"cat {CONTAINER_SHM}/host-wrote",
            f"echo from-container > {CONTAINER_SHM}/ctr-wrote",
            "echo x > /etc/rootfs-writable && echo rootfs-write-ok",  # the ro is the mount's
        ]
    )
    res = podman.run(
        cdi_ids=[cdi.qualified_id(KIND, device.name)],
        cdi_spec_dir=cdi_dir,
        command=probe_script(["/dev/davinci0", "/dev/davinci_manager"], extra=extra),
    )
    assert res.returncode == 0, res.stderr
    probe = parse_probe(res.stdout)

    assert probe.env["FLEXNPU_CONF"] == CONTAINER_CONF
    assert probe.env["FLEXNPU_VNPU_0"] == "vnpu-0"
    assert [line for line in probe.other if line.startswith("conf ")] == [
        f"conf {line}" for line in conf_text.splitlines()
    ]
    assert "Read-only file system" in res.stderr
    assert "conf-write-refused" in probe.other and "rootfs-write-ok" in probe.other
    assert (conf_dir / "client.conf").read_text() == conf_text
    assert {"ro", "nosuid", "nodev"} <= set(probe.mounts[CONTAINER_CONF])
    assert "rw" in probe.mounts[CONTAINER_SHM]
    assert "from-host" in probe.other
    assert (shm_dir / "ctr-wrote").read_text() == "from-container\n"
    assert not any(d.startswith("davinci") for d in probe.dev), probe.dev
    assert probe.nodes == {"/dev/davinci0": "absent", "/dev/davinci_manager": "absent"}


def test_node_prepared_whole_die_runs_in_podman_until_unprepared(
    podman: Podman, node_factory: Callable[..., Node]
) -> None:
    """The node process writes the spec; podman injects it; after unprepare it is unresolvable."""
    node = node_factory().start()  # the factory stops it and removes its control link
    wait_for(node.devices, what="published devices")
    uid = node.create_claim("e2e", WHOLE)
    alloc = node.scheduler.allocate(NAMESPACE, "e2e", NODE)
    device = alloc["status"]["allocation"]["devices"]["results"][0]["device"]
    phy = int(device.split("-")[1])
    ref = ClaimRef(NAMESPACE, uid, "e2e")
    assert node.kubelet is not None
    result = node.kubelet.prepare([ref])[uid]
    assert result.error == ""
    cdi_ids = [i for d in result.devices for i in d.cdi_device_ids]
    assert cdi_ids == [f"flexnpu.io/vnpu={uid}-{device}"]

    other = f"/dev/davinci{1 - phy}"  # a3-one-module: dies 0 and 1
    probe = run_ok(podman, cdi_ids, node.dirs["cdi"], probe_script([f"/dev/davinci{phy}", other]))
    assert probe.nodes == {f"/dev/davinci{phy}": CHAR_NULL, other: "absent"}
    assert probe.env["FLEXNPU_CLAIM_UID"] == uid

    assert node.kubelet.unprepare([ref]) == {uid: ""}
    assert node.cdi_specs() == []
    gone = podman.run(cdi_ids=cdi_ids, cdi_spec_dir=node.dirs["cdi"], command="echo ran")
    assert gone.returncode == 126, gone
    assert f"{UNRESOLVABLE} {cdi_ids[0]}" in gone.stderr
    assert "ran" not in gone.stdout


UNRESOLVED = f"Error: setting up CDI devices: {UNRESOLVABLE} {{id}}"


@pytest.mark.parametrize(
    ("kind", "version", "rc", "error", "debug"),
    [
        pytest.param("flexnpu.io/vnpu", None, 0, "", "", id="as-written-0.5.0"),
        pytest.param(
            "flexnpu.io/vnpu", "0.6.0", 126, UNRESOLVED, 'invalid version "0.6.0"', id="forced-0.6.0"
        ),
        pytest.param(
            "flexnpu.io/vnpu", "1.1.0", 126, UNRESOLVED, 'invalid version "1.1.0"', id="forced-1.1.0"
        ),
        pytest.param(
            "flexnpu.io/vnpu", "banana", 126, UNRESOLVED, 'invalid version "banana"', id="not-a-version"
        ),
        # A dot in the class needs cdiVersion 0.6.0 (the writer declares it), and podman 4.3.1's
        # parser does not even take such an ID for a CDI device: it stats it as a host path.
        # This is why the driver's kind is flexnpu.io/vnpu, not flexnpu.io/v.npu.
        pytest.param(
            "flexnpu.io/v.npu",
            None,
            125,
            "Error: stat {id}: no such file or directory",
            "",
            id="dotted-class",
        ),
    ],
)
def test_spec_versions_podman_4_3_rejects(
    podman: Podman, tmp_path: Path, kind: str, version: str | None, rc: int, error: str, debug: str
) -> None:
    inv = load("a3-one-module.yaml")
    devroot, cdi_dir = tmp_path / "devroot", tmp_path / "cdi"
    cdi_dir.mkdir()
    build_device_root(devroot, inv)
    uid = str(uuid.uuid4())
    spec = whole_die_spec(inv, 0, uid, devroot)
    spec = cdi.Spec(kind=cdi.Kind.parse(kind), devices=spec.devices, edits=spec.edits)
    path = cdi.write_spec(cdi_dir / cdi.spec_file_name(spec.kind, uid), spec, uid)
    doc = json.loads(path.read_text())
    assert doc["cdiVersion"] == ("0.6.0" if "." in spec.kind.cls else "0.5.0")
    if version is not None:
        doc["cdiVersion"] = version
        path.write_text(json.dumps(doc))
    cdi_id = cdi.qualified_id(spec.kind, spec.devices[0].name)

    # debug only where the container never starts: podman 4.3.1 stalls 20 s after a debug run
    res = podman.run(
        cdi_ids=[cdi_id], cdi_spec_dir=cdi_dir, command="echo ran", log_level="debug" if rc else None
    )
    assert res.returncode == rc, res.stderr[-2000:]
    if rc == 0:
        assert res.stdout.strip() == "ran"
        return
    assert error.format(id=cdi_id) in res.stderr
    assert debug in res.stderr.replace('\\"', '"')  # logrus escapes the quotes
    assert "ran" not in res.stdout


def test_missing_host_path_fails_the_run(podman: Podman, tmp_path: Path) -> None:
    """A spec whose device root was not built: the runtime refuses, it does not start empty."""
    inv = load("a3-one-module.yaml")
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    uid = str(uuid.uuid4())
    spec = whole_die_spec(inv, 0, uid, tmp_path / "never-built")
    cdi.write_spec(cdi_dir / cdi.spec_file_name(spec.kind, uid), spec, uid)
    res = podman.run(
        cdi_ids=[cdi.qualified_id(KIND, spec.devices[0].name)], cdi_spec_dir=cdi_dir, command="echo ran"
    )
    assert res.returncode != 0
    assert "no such file or directory" in res.stderr.lower()
    assert str(tmp_path / "never-built") in res.stderr
    assert "ran" not in res.stdout


@pytest.fixture
def netns() -> Iterator[tuple[str, str]]:
    """A network namespace holding a veth pair; yields (netns name, a link name inside it)."""
    tag = uuid.uuid4().hex[:8]
    name, link = f"fnpu-e2e-{tag}", f"fe{tag}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        subprocess.run(
            ["ip", "-n", name, "link", "add", link, "type", "veth", "peer", "name", f"fp{tag}"],
            check=True,
            capture_output=True,
        )
        yield name, link
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True, capture_output=True)


def test_run_joins_a_network_namespace_with_cdi_devices(
    podman: Podman, tmp_path: Path, netns: tuple[str, str]
) -> None:
    name, link = netns
    inv = load("a3-one-module.yaml")
    devroot, cdi_dir = tmp_path / "devroot", tmp_path / "cdi"
    cdi_dir.mkdir()
    build_device_root(devroot, inv)
    uid = str(uuid.uuid4())
    spec = whole_die_spec(inv, 0, uid, devroot)
    cdi.write_spec(cdi_dir / cdi.spec_file_name(spec.kind, uid), spec, uid)
    cdi_id = cdi.qualified_id(KIND, spec.devices[0].name)
    links = 'while read -r l rest; do echo "link ${l%:}"; done < /proc/net/dev'

    joined = podman.run(
        cdi_ids=[cdi_id], cdi_spec_dir=cdi_dir, command=probe_script(["/dev/davinci0"], links), netns=name
    )
    isolated = podman.run(
        cdi_ids=[cdi_id], cdi_spec_dir=cdi_dir, command=probe_script(["/dev/davinci0"], links)
    )

    assert joined.returncode == 0 and isolated.returncode == 0, joined.stderr + isolated.stderr
    j, i = parse_probe(joined.stdout), parse_probe(isolated.stdout)
    assert f"link {link}" in j.other and f"link {link}" not in i.other
    assert "link lo" in i.other
    assert j.nodes == i.nodes == {"/dev/davinci0": CHAR_NULL}


def test_run_sees_only_the_given_spec_dir(podman: Podman, tmp_path: Path) -> None:
    """The harness's private mount namespace: podman reads the given dir and nothing else."""
    ids = {}
    for name in ("a", "b"):
        spec_dir = tmp_path / name
        spec_dir.mkdir()
        uid = str(uuid.uuid4())
        dev = cdi.CDIDevice(cdi.device_name(uid, "npu-0"), cdi.Edits(env=(f"FROM_DIR={name}",)))
        cdi.write_spec(spec_dir / cdi.spec_file_name(KIND, uid), cdi.Spec(kind=KIND, devices=(dev,)), uid)
        ids[name] = cdi.qualified_id(KIND, dev.name)

    own = podman.run(cdi_ids=[ids["a"]], cdi_spec_dir=tmp_path / "a", command="echo $FROM_DIR")
    other = podman.run(cdi_ids=[ids["b"]], cdi_spec_dir=tmp_path / "a", command="echo $FROM_DIR")

    assert (own.returncode, own.stdout.strip()) == (0, "a"), own.stderr
    assert other.returncode == 126
    assert f"{UNRESOLVABLE} {ids['b']}" in other.stderr


def test_timeout_kills_the_run_and_close_removes_what_it_left(tmp_path: Path) -> None:
    reason = Podman.ensure_available()
    if reason is not None:
        podman_unavailable(reason)
    p = Podman(base_dir=tmp_path)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            p.run(cdi_ids=[], cdi_spec_dir=tmp_path, command="echo started; sleep 600", timeout=3)
        (left,) = p.containers()  # podman died with the run: the container is still recorded
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
        assert left not in ps and str(p.workdir) not in ps  # no conmon, no container process
        assert list(Path("/sys/fs/cgroup").glob(f"*/libpod_parent/libpod-{left}"))
    finally:
        p.close()
    assert not list(Path("/sys/fs/cgroup").glob(f"*/libpod_parent/libpod-{left}"))
    assert not p.workdir.exists()
