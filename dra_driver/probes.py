"""Kubernetes exec probes for the two DaemonSets: they ask the process, not the file system.

``python3 -m dra_driver.probes plugin`` (the node process's readiness and liveness):

* the registration socket answers ``GetInfo`` as a ``DRAPlugin`` named after this driver, with this instance's
  DRA endpoint — what the kubelet's plugin watcher asks first;
* the DRA endpoint serves a ``NodePrepareResources`` call with no claims (the kubelet's own service, through the
  plugin's handler, changes nothing);
* the instance says it serves (``dra_driver/readiness.py``): the kubelet registered it and it has published a
  complete pool — a plugin that never published a slice is not ready.

* and, when a daemon socket is configured, the daemon does not report that it refuses shares because a share's
  shm dir cannot be bounded on this node (an unreachable daemon does not fail the plugin's probe).

``python3 -m dra_driver.probes daemon`` (the daemon's liveness): ``flexnpu-daemon``'s API socket answers
``Health`` with ``ok`` and no shm problem (``flexnpu_runtime/daemon/shmroot.py``).

``python3 -m dra_driver.probes daemon-ready`` (its readiness): the same, and the answer also says the registry was
recovered (every live aclserver re-adopted) and, when ``FLEXNPU_DAEMON_INSTANCE`` is set (the chart passes the pod
UID), that it comes from this instance — not from another one that still holds the node's daemon lock during a
rolling update.

Both read the same flags' environment twins as the process they probe (``dra_driver/config.py``,
``flexnpu_runtime/daemon/main.py``), so the socket paths cannot drift from the container's environment. Exit status 0
when healthy, 1 with one line on stderr saying what did not answer, 2 for a usage error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

import grpc

from dra_driver import config, readiness
from dra_driver.errors import FlexNPUError
from dra_kubeletplugin.protos.gen import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)

__all__ = ["check_daemon", "check_daemon_ready", "check_plugin", "main"]

DEFAULT_TIMEOUT = 3.0


class ProbeFailed(Exception):
    """What did not answer, as one sentence."""


def check_plugin(env: Mapping[str, str], timeout: float = DEFAULT_TIMEOUT) -> str:
    """Registration GetInfo, then an empty NodePrepareResources on the endpoint it names; returns a summary."""
    cfg = config.build(config.resolve(config.from_args_namespace(), env))
    reg = cfg.registration_socket
    try:
        with grpc.insecure_channel(f"unix:{reg}") as channel:
            stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            info = stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        raise ProbeFailed(f"registration socket {reg} did not answer GetInfo: {exc.code().name}") from None
    if info.type != "DRAPlugin" or info.name != cfg.driver_name:
        raise ProbeFailed(
            f"registration socket {reg} is {info.type} {info.name!r}, not DRAPlugin {cfg.driver_name!r}"
        )
    if info.endpoint != str(cfg.dra_socket):
        raise ProbeFailed(
            f"registration names endpoint {info.endpoint}, this instance serves {cfg.dra_socket}"
        )
    try:
        with grpc.insecure_channel(f"unix:{info.endpoint}") as channel:
            dra = dra_v1_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
            dra.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        raise ProbeFailed(f"DRA endpoint {info.endpoint} did not answer: {exc.code().name}") from None
    if cfg.daemon_socket is not None:
        problem = _daemon_health(str(cfg.daemon_socket), timeout)
        if problem:
            raise ProbeFailed(f"flexnpu-daemon refuses shares on this node: {problem}")
    ready_file = readiness.path_for(cfg.paths.run_dir, cfg.pod_uid)
    state = readiness.read(ready_file)
    if state is None:
        raise ProbeFailed(f"no readiness record {ready_file}: the node process has not started its loops")
    if not state.ready:
        raise ProbeFailed(f"plugin {cfg.driver_name} answers on {reg} but is not ready: {state.missing()}")
    return f"plugin {cfg.driver_name} answers on {reg} and {info.endpoint}, registered, pool published"


def _daemon_health(socket_path: str, timeout: float) -> str:
    """The daemon's shm problem ("" when none, or when the daemon does not answer)."""
    from dra_driver.daemon_api.client import DaemonClient

    client = DaemonClient(socket_path, timeout=timeout)
    try:
        return client.health().shm_problem
    except FlexNPUError:
        return ""
    finally:
        client.close()


def check_daemon(env: Mapping[str, str], timeout: float = DEFAULT_TIMEOUT, *, ready: bool = False) -> str:
    """The daemon's Health call (``ready``: adopted, by this instance); returns a summary."""
    from dra_driver.daemon_api.client import DaemonClient
    from flexnpu_runtime.daemon import main as daemon_main

    values = config.resolve(config.from_args_namespace(daemon_main.FLAGS), env, daemon_main.FLAGS)
    socket_path = values.get("socket") or ""
    client = DaemonClient(socket_path, timeout=timeout)
    try:
        health = client.health()
    except FlexNPUError as exc:
        raise ProbeFailed(f"daemon socket {socket_path} did not answer Health: {exc}") from None
    finally:
        client.close()
    if not health.ok:
        raise ProbeFailed(f"daemon on {socket_path} reports not ok")
    if health.shm_problem:
        raise ProbeFailed(f"daemon on {socket_path} refuses shares: {health.shm_problem}")
    mine = values.get("instance") or ""
    if ready and mine and health.instance != mine:
        raise ProbeFailed(
            f"daemon on {socket_path} is instance {health.instance or '-'}, not this one ({mine}): waiting for its lock"
        )
    if ready and not health.adopted:
        raise ProbeFailed(f"daemon on {socket_path} has not re-adopted its aclservers yet")
    bounded = f"; cgroups: {health.cgroups}" if health.cgroups else f"; unbounded: {health.cgroup_problem}"
    return (
        f"daemon pid {health.pid} answers on {socket_path}: {health.entities} aclserver(s), {health.dies} die(s)"
        f"{bounded if ready else ''}"
    )


def check_daemon_ready(env: Mapping[str, str], timeout: float = DEFAULT_TIMEOUT) -> str:
    return check_daemon(env, timeout, ready=True)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    checks = {"plugin": check_plugin, "daemon": check_daemon, "daemon-ready": check_daemon_ready}
    if len(args) != 1 or args[0] not in checks:
        sys.stderr.write("usage: python3 -m dra_driver.probes plugin|daemon|daemon-ready\n")
        return 2
    try:
        summary = checks[args[0]](os.environ if env is None else env)
    except (ProbeFailed, FlexNPUError) as exc:
        sys.stderr.write(f"probe {args[0]}: {exc}\n")
        return 1
    sys.stdout.write(summary + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
