"""A soft-split share, prepared by the real node process and daemon, consumed by podman.

The kubelet simulator prepares a share claim through the node process; podman 4.3.1 injects the
spec the node wrote (``flexnpu_testing.podman``). Inside a busybox container: the read-only
client.conf, the claim's shm dir with the aclserver's unix socket, no device node, and, from a
network namespace attached to the node's control-link bridge, a PING answered over TCP by the
claim's aclserver. After unprepare the CDI ID no longer resolves and the shm dir is gone.
"""

from __future__ import annotations

import contextlib
import json
import random
import shlex
import struct
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_driver.checkpoint import CheckpointStore
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_testing.podman import UNRESOLVABLE, Podman
from flexnpu_testing.waiting import wait_for
from flexnpu_wire import framing as protocol
from kubeletplugin.prepare import CONTAINER_CONF, CONTAINER_SHM
from tests.e2e.conftest import podman_unavailable
from tests.integration.conftest import NAMESPACE, NODE, Node

pytestmark = [pytest.mark.podman, pytest.mark.root]

MI = 1024 * 1024
MEMORY, COMPUTE = 256 * MI, 30
PING_ID = 0x0F1E2D3C
LINK_NET = "169.254.213"  # the node's default control link is 169.254.213.1/24


@dataclass
class Share:
    """A prepared share claim and where its files are on the host."""

    node: Node
    ref: ClaimRef
    cdi_ids: list[str]
    conf: dict[str, Any]  # the host's client.conf
    conf_host: Path
    shm_host: Path
    token: str  # as the node recorded it in its checkpoint

    @property
    def socket_name(self) -> str:
        unix: str = self.conf["endpoints"]["unix"]
        assert unix.startswith(f"{CONTAINER_SHM}/"), unix
        return Path(unix).name

    @property
    def tcp(self) -> tuple[str, int]:
        host, _, port = str(self.conf["endpoints"]["tcp"]).rpartition(":")
        return host, int(port)


@pytest.fixture
def share(node_factory: Callable[..., Node]) -> Share:
    """One share (256 MiB, 30 %) prepared through the real node process and daemon.

    Tests list ``share`` before ``podman``: podman's fixture (no container left) is then set up
    after the node and torn down before it.
    """
    reason = Podman.ensure_available()
    if reason is not None:
        podman_unavailable(reason)
    node = node_factory(daemon=True, FLEXNPU_DEFAULT_MODE="both").start()
    wait_for(node.devices, what="published devices")
    request = {
        "name": "vnpu",
        "exactly": {
            "deviceClassName": "vnpu.flexnpu.io",
            "count": 1,
            "capacity": {"requests": {"memory": "256Mi", "compute": str(COMPUTE)}},
        },
    }
    uid = node.create_claim("e2e-share", [request])
    node.scheduler.allocate(NAMESPACE, "e2e-share", NODE)
    ref = ClaimRef(NAMESPACE, uid, "e2e-share")
    assert node.kubelet is not None
    result = node.kubelet.prepare([ref])[uid]
    assert result.error == "", result.error
    cdi_ids = [i for d in result.devices for i in d.cdi_device_ids]
    assert len(cdi_ids) == 1 and cdi_ids[0].startswith(f"flexnpu.io/vnpu={uid}-vnpu-"), cdi_ids

    (spec_file,) = [p for p in node.cdi_specs() if uid in p.name]
    mounts = {
        m["containerPath"]: m["hostPath"]
        for m in json.loads(spec_file.read_text())["containerEdits"]["mounts"]
    }
    conf_host = Path(mounts[CONTAINER_CONF])
    entry = CheckpointStore(node.dirs["state"] / "checkpoint.json").read().claims[uid]
    registration = entry.registration
    assert registration is not None
    return Share(
        node=node,
        ref=ref,
        cdi_ids=cdi_ids,
        conf=json.loads(conf_host.read_text()),
        conf_host=conf_host,
        shm_host=Path(mounts[CONTAINER_SHM]),
        token=registration.token,
    )


def run(
    podman: Podman, share: Share, command: str, netns: str | None = None
) -> subprocess.CompletedProcess[str]:
    return podman.run(
        cdi_ids=share.cdi_ids, cdi_spec_dir=share.node.dirs["cdi"], command=command, netns=netns, timeout=30
    )


def sections(stdout: str) -> dict[str, str]:
    """Split output written as ``@@name`` marker lines followed by that section's text."""
    out: dict[str, list[str]] = {}
    current: list[str] = []
    for line in stdout.splitlines():
        if line.startswith("@@"):
            current = out.setdefault(line[2:], [])
        else:
            current.append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def test_share_container_sees_conf_socket_and_shm(share: Share, podman: Podman) -> None:
    nonce = uuid.uuid4().hex
    sock = f"{CONTAINER_SHM}/{share.socket_name}"
    script = "\n".join(
        [
            'echo "@@conf-env"; echo "$FLEXNPU_CONF"',
            'echo "@@conf"; cat "$FLEXNPU_CONF"',
            'echo "@@conf-write"; echo tampered >> "$FLEXNPU_CONF" && echo conf-write-ok || echo conf-write-refused',
            f'echo "@@socket"; if [ -S {sock} ]; then echo socket; elif [ -e {sock} ]; then echo other; fi',
            f'echo "@@shm-write"; echo {nonce} > {CONTAINER_SHM}/from-container && echo shm-write-ok',
            'echo "@@dev"; for d in /dev/*; do echo "${d#/dev/}"; done',
        ]
    )
    res = run(podman, share, script)
    assert res.returncode == 0, f"rc {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    seen = sections(res.stdout)

    assert seen["conf-env"] == CONTAINER_CONF == "/etc/flexnpu/client.conf"
    conf = json.loads(seen["conf"])
    assert conf == share.conf
    assert conf["claim_uid"] == share.ref.uid
    assert conf["token"] == share.token and len(share.token) >= 16
    assert [(s["memory_bytes"], s["compute_percent"]) for s in conf["shares"]] == [(MEMORY, COMPUTE)]
    assert seen["conf-write"] == "conf-write-refused"
    assert "Read-only file system" in res.stderr
    assert json.loads(share.conf_host.read_text()) == share.conf
    assert seen["socket"] == "socket", f"{sock}: {seen['socket'] or 'absent'}"
    assert seen["shm-write"] == "shm-write-ok"
    assert (share.shm_host / "from-container").read_text() == f"{nonce}\n"
    dev = seen["dev"].split()
    assert "null" in dev  # the listing works
    assert not [d for d in dev if d.startswith("davinci")], dev


def ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    assert res.returncode == 0, f"ip {shlex.join(args)}: {res.stderr.strip()}"


def claim_address(bridge: str) -> str:
    """A free address of the control link's /24, claimed by a /32 route out of ``bridge``.

    Every node bridge on the machine carries 169.254.213.1/24; the /32 route makes the host
    answer this address out of ``bridge``, and ``ip route add`` refusing a duplicate keeps
    two tests from picking the same address.
    """
    for last in random.sample(range(100, 250), 150):
        address = f"{LINK_NET}.{last}"
        res = subprocess.run(
            ["ip", "route", "add", f"{address}/32", "dev", bridge],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode == 0:
            return address
        assert "File exists" in res.stderr, f"ip route add {address}/32 dev {bridge}: {res.stderr.strip()}"
    raise AssertionError(f"no free address in {LINK_NET}.100-249")


@contextlib.contextmanager
def attached_netns(bridge: str) -> Iterator[tuple[str, str]]:
    """A network namespace wired to ``bridge`` by a veth pair; yields (netns name, its address).

    Removes the route, the veth pair and the netns afterwards.
    """
    tag = uuid.uuid4().hex[:8]
    name, host_end, ns_end = f"fnpu-e2e-{tag}", f"fh{tag}", f"fn{tag}"
    wait_for(Path(f"/sys/class/net/{bridge}").exists, what=f"control link {bridge}")
    ip("netns", "add", name)
    address = None
    try:
        ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end, "netns", name)
        ip("link", "set", host_end, "master", bridge, "up")
        address = claim_address(bridge)
        ip("-n", name, "addr", "add", f"{address}/24", "dev", ns_end)
        ip("-n", name, "link", "set", ns_end, "up")
        ip("-n", name, "link", "set", "lo", "up")
        yield name, address
    finally:
        if address is not None:
            subprocess.run(
                ["ip", "route", "del", f"{address}/32", "dev", bridge], capture_output=True, check=False
            )
        subprocess.run(["ip", "link", "del", host_end], capture_output=True, check=False)
        ip("netns", "del", name)
    assert not Path(f"/sys/class/net/{host_end}").exists()
    assert not Path(f"/run/netns/{name}").exists()


def octal(frame: bytes) -> str:
    """``frame`` as printf octal escapes (safe inside single quotes)."""
    return "".join(f"\\{b:03o}" for b in frame)


def test_share_container_pings_aclserver_over_control_link(share: Share, podman: Podman) -> None:
    host, port = share.tcp
    assert host == f"{LINK_NET}.1"
    bridge = share.node.env["FLEXNPU_CONTROL_LINK"]
    frame = protocol.encode(protocol.Op.PING, PING_ID)
    ping = f"printf '{octal(frame)}' | nc -w 5 {host} {port} | od -An -tx1 -v"

    with attached_netns(bridge) as (netns, address):
        joined = run(podman, share, f"echo @@addr; ip -4 addr; echo @@ping; {ping}", netns=netns)
    isolated = run(podman, share, f"echo @@ping; {ping}")

    assert joined.returncode == 0, f"stdout:\n{joined.stdout}\nstderr:\n{joined.stderr}"
    assert f"inet {address}/24" in sections(joined.stdout)["addr"]
    raw = bytes.fromhex(sections(joined.stdout)["ping"])
    assert len(raw) >= 4, f"no reply\nstdout:\n{joined.stdout}\nstderr:\n{joined.stderr}"
    (length,) = struct.unpack_from(">I", raw)
    assert len(raw) == 4 + length, raw.hex()
    reply = protocol.decode(raw, 4, length)
    assert share.node.daemon is not None
    aclservers = share.node.daemon.aclserver_pids()
    assert (reply.op, reply.flags, reply.request_id) == (protocol.Op.PING, protocol.FLAG_REPLY, PING_ID)
    assert reply.ints[0] == 0, reply  # ACL_SUCCESS
    # before HELLO a TCP PING tells no host PID (issue 25: nothing about the host to an unauthenticated peer)
    assert reply.ints[1] == 0 and aclservers, (reply, aclservers)
    assert reply.tail == b"PONG"
    # without the netns the container has only lo: the reply above came over the control link
    assert sections(isolated.stdout)["ping"].strip() == "", isolated.stdout
    assert "nc: " in isolated.stderr, isolated.stderr


def test_unprepared_share_is_unresolvable_and_its_shm_dir_gone(share: Share, podman: Podman) -> None:
    wrote = run(podman, share, f"echo x > {CONTAINER_SHM}/left-by-container && echo wrote")
    assert (wrote.returncode, wrote.stdout.strip()) == (0, "wrote"), wrote.stderr
    assert (share.shm_host / "left-by-container").exists()

    assert share.node.kubelet is not None
    assert share.node.kubelet.unprepare([share.ref]) == {share.ref.uid: ""}

    assert not share.shm_host.exists()
    assert not share.conf_host.exists() and share.node.cdi_specs() == []
    daemon = share.node.daemon
    assert daemon is not None
    wait_for(lambda: not daemon.aclserver_pids(), what="the claim's aclserver to exit")
    gone = run(podman, share, "echo ran")
    assert gone.returncode == 126, gone
    assert f"{UNRESOLVABLE} {share.cdi_ids[0]}" in gone.stderr
    assert "ran" not in gone.stdout
