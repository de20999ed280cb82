"""The node-level benches' cluster: a fake API server, flexnpu-daemon and the node process.

``cluster()`` is what ``bench_prepare.py``, ``bench_scale.py``, ``bench_soak.py`` and
``_hard_prepare.py`` (``bench_hard.py --prepare``) run against; each passes only what differs
(inventory, mode, extra environment, whether shares need a daemon). Everything is torn down on
exit, also after a fault the soak left switched on. The scripts put the repository on
``sys.path`` before importing this module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

from dra_driver import netlink
from flexnpu_testing.daemon import DaemonProc
from flexnpu_testing.fake_apiserver import FakeAPIServer
from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import NAMESPACE, NODE, SOFT_CEL, WHOLE_CEL, Node, make_node

CLASSES: tuple[tuple[str, str], ...] = (("npu.flexnpu.io", WHOLE_CEL), ("vnpu.flexnpu.io", SOFT_CEL))


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.1f} ms"


@contextlib.contextmanager
def cluster(
    root: Path,
    *,
    inventory: str = "eight-910b4.yaml",
    classes: Sequence[tuple[str, str]] = CLASSES,
    daemon_args: Sequence[str] = (),
    with_daemon: bool = True,
    published_timeout: float = 30.0,
    **env: str,
) -> Iterator[Node]:
    """Fake API server (with the Node, the namespace and ``classes``) + daemon + node process."""
    with FakeAPIServer() as srv:
        core: Any = client.CoreV1Api(srv.api_client())
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        res: Any = client.ResourceV1Api(srv.api_client())
        for name, cel in classes:
            res.create_device_class(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "DeviceClass",
                    "metadata": {"name": name},
                    "spec": {"selectors": [{"cel": {"expression": cel}}]},
                }
            )
        daemon = DaemonProc(extra=(*daemon_args, "--log-level", "INFO")) if with_daemon else None
        node: Node | None = None
        try:
            if daemon is not None:
                daemon.start()
                env = {
                    "FLEXNPU_DAEMON_SOCKET": str(daemon.socket),
                    "FLEXNPU_SHM_DIR": str(daemon.shm_root),
                    **env,
                }
            node = make_node(srv, root / "n0", inventory, **env)
            node.daemon = daemon
            node.start()
            wait_for(node.devices, what="published devices", timeout=published_timeout)
            yield node
        finally:
            srv.set_down(False)  # a fault the soak left on must not stall the teardown
            srv.answer_normally()
            if node is not None:
                node.stop()
                with contextlib.suppress(Exception):
                    netlink.remove_link(node.env["FLEXNPU_CONTROL_LINK"])
            if daemon is not None:
                daemon.cleanup()
