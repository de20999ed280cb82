"""The control link from a pod's point of view: a client in its own network namespace.

Two share claims (A and B) are prepared through the real node process, daemon and aclservers.
A network namespace with a veth pair stands in for a pod: its host end is a port of the node's
control-link bridge (``FLEXNPU_CONTROL_LINK``), its pod end gets a free address in
169.254.213.0/24. A child process run inside that namespace (``ip netns exec``) uses the
project's client library over TCP: it reaches its own claim's aclserver, works within the quota,
and is refused (invalid token) when it presents the other claim's token. The unix socket in the
claim's shm dir serves the same client, from the host and from inside the namespace (a unix
socket is a file, so a pod reaches it through the bind-mounted shm dir, whatever its netns).

Many nodes (other tests, run in parallel) own bridges carrying the same 169.254.213.1/24, so
the host's connected routes for that /24 are ambiguous. The fixture therefore also adds a /32
route for the pod's address via this node's bridge (which doubles as a lock on the address).
Everything the test creates (netns, veth, route) is removed in the fixture's teardown.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import os
import random
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyroute2 import IPRoute, NetNS, netns
from pyroute2.netlink.exceptions import NetlinkError

from dra_driver import wirefiles
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_client.session import Session
from flexnpu_testing.waiting import wait_for
from flexnpu_wire import clientconf
from flexnpu_wire.clientconf import ClientConf, Endpoints
from flexnpu_wire.codes import ACL_ERROR_RT_MEMORY_ALLOCATION
from tests.integration.conftest import NAMESPACE, NODE, REPO, Node


def addresses(name: str) -> list[str]:
    """The link's IPv4 addresses as CIDR strings (empty if the link is missing)."""
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=name)
        if not found:
            return []
        out: list[Any] = ipr.get_addr(index=found[0], family=2)
        return sorted(f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}" for a in out)


MI = 1024 * 1024
CONTROL_NET = ipaddress.ip_network("169.254.213.0/24")
POD_HOSTS = range(200, 251)  # pod addresses are picked from 169.254.213.200-250
RT_SCOPE_LINK = 253
EEXIST = 17

# Run inside the pod's netns. Input: a JSON list of cases {name, conf (path), prefer, malloc,
# too_much}; output: one JSON object {name: result} on stdout, plus the child's netns identity.
CHILD = r"""
import json, os, sys
from flexnpu_wire import clientconf
from dra_driver import wirefiles, netlink
from flexnpu_client.errors import AclError, ConnectError
from flexnpu_client.session import Session

out = {"netns": os.readlink("/proc/self/ns/net"), "cases": {}}
for case in json.loads(open(sys.argv[1]).read()):
    conf = wirefiles.load_client_conf(case["conf"])
    try:
        with Session.open(conf, prefer=case["prefer"], timeout=10.0) as s:
            sock = s.link.sock.getsockname()
            r = {"transport": s.transport_kind, "local": sock[0] if isinstance(sock, tuple) else sock}
            s.init()
            s.set_device(0)
            r["total"] = s.get_mem_info()[1]
            ptr = s.malloc(case["malloc"])
            r["free_after_malloc"] = s.get_mem_info()[0]
            try:
                s.free(s.malloc(case["too_much"]))
                r["over_quota"] = "allowed"
            except AclError as err:
                r["over_quota"] = err.ret
            s.free(ptr)
    except ConnectError as err:
        r = {"refused": str(err)}
    out["cases"][case["name"]] = r
print(json.dumps(out))
"""


@dataclasses.dataclass(frozen=True)
class Pod:
    """A network namespace wired to the node's control-link bridge."""

    netns: str
    address: str
    host_if: str

    def run(self, cases: list[dict[str, Any]], workdir: Path) -> dict[str, Any]:
        """Run the client cases in a child process inside the netns; its JSON result."""
        case_file = workdir / f"cases-{uuid.uuid4().hex[:8]}.json"
        case_file.write_text(json.dumps(cases))
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXNPU_")}
        env["PYTHONPATH"] = str(REPO)
        done = subprocess.run(
            ["ip", "netns", "exec", self.netns, sys.executable, "-c", CHILD, str(case_file)],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"client in netns failed ({done.returncode}):\n{done.stderr}"
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result


def _claim_pod_address(ipr: IPRoute, bridge_index: int) -> str:
    """Pick a free pod address: a /32 route via our bridge, which fails with EEXIST when taken."""
    hosts = list(POD_HOSTS)
    random.shuffle(hosts)
    for host in hosts:
        address = str(CONTROL_NET.network_address + host)
        try:
            ipr.route("add", dst=f"{address}/32", oif=bridge_index, scope=RT_SCOPE_LINK)
        except NetlinkError as exc:
            if exc.code == EEXIST:
                continue
            raise
        return address
    raise AssertionError(f"no free pod address in {CONTROL_NET} .{POD_HOSTS.start}-.{POD_HOSTS.stop - 1}")


@contextlib.contextmanager
def pod_network(bridge: str) -> Iterator[Pod]:
    """A netns + veth pair whose host end is a port of ``bridge``; removed on exit."""
    tag = uuid.uuid4().hex[:8]
    name, host_if, pod_if = f"fxpod-{tag}", f"fxh{tag}", f"fxp{tag}"
    address = ""
    netns.create(name)
    try:
        with IPRoute() as ipr:
            (bridge_index,) = ipr.link_lookup(ifname=bridge)
            ipr.link("add", ifname=host_if, kind="veth", peer={"ifname": pod_if, "net_ns_fd": name})
            (host_index,) = ipr.link_lookup(ifname=host_if)
            ipr.link("set", index=host_index, master=bridge_index, state="up")
            address = _claim_pod_address(ipr, bridge_index)
        with NetNS(name) as ns:
            (pod_index,) = ns.link_lookup(ifname=pod_if)
            ns.addr("add", index=pod_index, address=address, prefixlen=CONTROL_NET.prefixlen)
            ns.link("set", index=pod_index, state="up")
            (lo_index,) = ns.link_lookup(ifname="lo")
            ns.link("set", index=lo_index, state="up")
        yield Pod(netns=name, address=address, host_if=host_if)
    finally:
        with IPRoute() as ipr:
            if address:
                with contextlib.suppress(NetlinkError):
                    ipr.route("del", dst=f"{address}/32", scope=RT_SCOPE_LINK)
            found = ipr.link_lookup(ifname=host_if)
            if found:
                ipr.link("del", index=found[0])  # takes the netns end with it
        netns.remove(name)


def _host_route(ipr: IPRoute, address: str) -> bool:
    """Whether the main table holds a /32 route for ``address`` (a dump, not a lookup)."""
    return any(
        r["dst_len"] == 32 and r.get_attr("RTA_DST") == address for r in ipr.get_routes(family=2, table=254)
    )


def _share_request(memory: str, compute: str) -> list[dict[str, Any]]:
    return [
        {
            "name": "vnpu",
            "exactly": {
                "deviceClassName": "vnpu.flexnpu.io",
                "capacity": {"requests": {"memory": memory, "compute": compute}},
            },
        }
    ]


@dataclasses.dataclass(frozen=True)
class Prepared:
    uid: str
    conf: ClientConf  # as written for the container
    shm_host: str  # the host dir bind-mounted at the container's shm_dir

    @property
    def unix_host(self) -> str:
        assert self.conf.endpoints.unix is not None
        return str(Path(self.shm_host) / Path(self.conf.endpoints.unix).name)

    def host_conf(self, *, transport: str, token: str | None = None) -> ClientConf:
        """The claim's conf with host paths and only one endpoint, optionally with another token."""
        endpoints = (
            Endpoints(tcp=self.conf.endpoints.tcp) if transport == "tcp" else Endpoints(unix=self.unix_host)
        )
        return dataclasses.replace(
            self.conf, shm_dir=self.shm_host, endpoints=endpoints, token=token or self.conf.token
        )


def _prepare(node: Node, name: str, memory: str, compute: str) -> Prepared:
    uid = node.create_claim(name, _share_request(memory, compute))
    node.scheduler.allocate(NAMESPACE, name, NODE)
    assert node.kubelet is not None
    res = node.kubelet.prepare([ClaimRef(NAMESPACE, uid, name)])[uid]
    assert res.error == "", res.error
    conf = wirefiles.load_client_conf(node.dirs["run"] / "claims" / uid / "client.conf")
    spec = json.loads(next(p for p in node.cdi_specs() if uid in p.name).read_text())
    shm_host = next(
        m["hostPath"] for m in spec["containerEdits"]["mounts"] if m["containerPath"] == "/dev/shm/flexnpu"
    )
    return Prepared(uid=uid, conf=conf, shm_host=shm_host)


@pytest.fixture
def soft_node(node_factory: Callable[..., Node]) -> Node:
    n = node_factory(daemon=True, FLEXNPU_DEFAULT_MODE="both", FLEXNPU_DAEMON_RETRY_SECONDS="2").start()
    wait_for(n.devices, what="published devices")
    return n


@pytest.fixture
def claims(soft_node: Node) -> tuple[Prepared, Prepared]:
    a = _prepare(soft_node, "claim-a", "256Mi", "20")
    b = _prepare(soft_node, "claim-b", "384Mi", "30")
    for p in (a, b):
        assert p.conf.endpoints.tcp and p.conf.endpoints.tcp.startswith("169.254.213.1:")
        assert p.conf.endpoints.unix and p.conf.endpoints.unix.startswith("/dev/shm/flexnpu/")
    assert a.conf.endpoints.tcp != b.conf.endpoints.tcp and a.conf.token != b.conf.token
    return a, b


@pytest.fixture
def pod(soft_node: Node) -> Iterator[Pod]:
    bridge = soft_node.env["FLEXNPU_CONTROL_LINK"]
    assert addresses(bridge) == ["169.254.213.1/24"]  # made by the node process
    with pod_network(bridge) as p:
        yield p


def _write(conf: ClientConf, path: Path) -> str:
    path.write_text(clientconf.render(conf))
    return str(path)


@pytest.mark.root
def test_pod_reaches_its_aclserver_over_tcp_and_not_with_another_token(
    claims: tuple[Prepared, Prepared], pod: Pod, tmp_path: Path
) -> None:
    a, b = claims
    cases: list[dict[str, Any]] = [
        {
            "name": "a-own-token",
            "conf": _write(a.host_conf(transport="tcp"), tmp_path / "a.conf"),
            "prefer": "tcp",
            "malloc": 128 * MI,
            "too_much": 256 * MI,
        },
        {
            "name": "a-endpoint-b-token",
            "conf": _write(a.host_conf(transport="tcp", token=b.conf.token), tmp_path / "ab.conf"),
            "prefer": "tcp",
        },
        {
            "name": "b-endpoint-a-token",
            "conf": _write(b.host_conf(transport="tcp", token=a.conf.token), tmp_path / "ba.conf"),
            "prefer": "tcp",
        },
        {
            "name": "b-own-token",
            "conf": _write(b.host_conf(transport="tcp"), tmp_path / "b.conf"),
            "prefer": "tcp",
            "malloc": 256 * MI,
            "too_much": 256 * MI,
        },
        {
            "name": "a-unix-from-netns",
            "conf": _write(a.host_conf(transport="unix"), tmp_path / "au.conf"),
            "prefer": "unix",
            "malloc": 128 * MI,
            "too_much": 256 * MI,
        },
    ]
    out = pod.run(cases, tmp_path)
    assert out["netns"] != os.readlink("/proc/self/ns/net"), "the client did not run in its own netns"
    got = out["cases"]
    # Own claim over TCP, from the pod's address, within the quota and refused beyond it.
    assert got["a-own-token"] == {
        "transport": "tcp",
        "local": pod.address,
        "total": 256 * MI,
        "free_after_malloc": 128 * MI,
        "over_quota": ACL_ERROR_RT_MEMORY_ALLOCATION,
    }
    assert got["b-own-token"] == {
        "transport": "tcp",
        "local": pod.address,
        "total": 384 * MI,
        "free_after_malloc": 128 * MI,
        "over_quota": ACL_ERROR_RT_MEMORY_ALLOCATION,
    }
    # Another claim's token is an authentication error, both ways round.
    for name in ("a-endpoint-b-token", "b-endpoint-a-token"):
        assert set(got[name]) == {"refused"}, got[name]
        assert "refused the connection" in got[name]["refused"] and "invalid token" in got[name]["refused"]
    # The unix socket lives in the shm dir and serves a client in any netns.
    assert got["a-unix-from-netns"]["transport"] == "unix"
    assert got["a-unix-from-netns"]["total"] == 256 * MI


def test_unix_socket_in_the_shm_dir_serves_the_claim(claims: tuple[Prepared, Prepared]) -> None:
    a, b = claims
    for p, quota in ((a, 256 * MI), (b, 384 * MI)):
        assert Path(p.unix_host).parent == Path(p.shm_host)
        with Session.open(p.host_conf(transport="unix"), prefer="unix") as s:
            assert s.transport_kind == "unix"
            s.init()
            s.set_device(0)
            assert s.get_mem_info()[1] == quota
            s.free(s.malloc(quota))


@pytest.mark.root
def test_pod_network_is_removed(soft_node: Node) -> None:
    """The fixture's own contract: nothing of the pod network stays behind."""
    with pod_network(soft_node.env["FLEXNPU_CONTROL_LINK"]) as p:
        assert p.netns in netns.listnetns()
        with IPRoute() as ipr:
            assert ipr.link_lookup(ifname=p.host_if)
            assert _host_route(ipr, p.address)
    assert p.netns not in netns.listnetns()
    with IPRoute() as ipr:
        assert not ipr.link_lookup(ifname=p.host_if)
        assert not _host_route(ipr, p.address)
