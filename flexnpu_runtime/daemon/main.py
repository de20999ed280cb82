"""``flexnpu-daemon``: flags (each with a ``FLEXNPU_DAEMON_…`` twin), wiring and signals only.

Start-up order: parse flags → take the instance lock (``instance``; a second instance waits
here) → find the claims' cgroups (``cgroups``: joins the host's cgroup namespace, before any
thread or child exists) → discover dies → recover the registry (re-adopt / clean) → serve the
API → monitor aclservers. SIGTERM/SIGINT stop serving and monitoring but leave every aclserver
running: they live in their own cgroups and sessions, outside the daemon's container, and the
next instance re-adopts them.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_driver import config, discovery, logs
from dra_driver.daemon_api.client import DEFAULT_SOCKET
from dra_driver.devices import Health
from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput
from dra_driver.liveness import handle_signals
from flexnpu_runtime.daemon import bounds, cgroup_layout, cgroups, instance, ownership, service, shmroot
from flexnpu_runtime.daemon.launcher import Launcher, SpawnLauncher, ZygoteLauncher
from flexnpu_runtime.daemon.manager import Manager, Settings
from flexnpu_runtime.daemon.model import DieCapacity
from flexnpu_wire.launch import DEFAULT_MAX_SESSIONS

log = logging.getLogger("flexnpu.daemon")

SIGNAL_CHECK_SECONDS = 0.2
"""The main thread waits for a stop in steps this short. The kernel may hand SIGTERM to any thread (a
gRPC one); Python then runs the handler only when the main thread executes again, which a wait
without a timeout would never let it do (found: ``podman stop`` hit its 20 s SIGKILL in 5 of 12 runs)."""

DEFAULT_ACLSERVER_COMMAND = (
    f"{shlex.quote(sys.executable)} -m flexnpu_runtime.aclserver --title-room {'_' * 64}"
)
"""The spare ``--title-room`` argument leaves the aclserver room to show its claim UID in ``ps``."""


ENV_PREFIX = "FLEXNPU_DAEMON_"


@dataclass(frozen=True, slots=True)
class DaemonFlag(config.Flag):
    """A flag whose environment twin is ``FLEXNPU_DAEMON_<NAME>``."""

    env_prefix: str = ENV_PREFIX


FLAGS: tuple[config.Flag, ...] = (
    DaemonFlag("socket", DEFAULT_SOCKET, "unix socket of the daemon API (created mode 0600)"),
    DaemonFlag("state-dir", "/var/lib/flexnpu/daemon", "persistent directory of registry.json"),
    *(f.with_env_prefix(ENV_PREFIX) for f in config.SHARED_FLAGS),  # run-dir, shm-root, max-shares-per-die
    DaemonFlag("inventory", None, "emulated inventory file (YAML/JSON); when absent, discover with npu-smi"),
    DaemonFlag("npu-smi", "npu-smi", "npu-smi executable used when no --inventory is given"),
    DaemonFlag(
        "rediscover-seconds",
        "30",
        "how often the dies are discovered again, so dies added to the node are served (0 = never)",
    ),
    DaemonFlag("tcp-host", "127.0.0.1", "default host address of the aclservers' TCP control link"),
    DaemonFlag("log-level", "INFO", "log level"),
    DaemonFlag("log-json", "false", "log JSON lines instead of text (true|false)"),
    DaemonFlag(
        "aclserver-command",
        None,
        f"aclserver command, '--spec <file>' appended; when set it is always spawned"
        f" (default: {DEFAULT_ACLSERVER_COMMAND})",
    ),
    DaemonFlag("launcher", "zygote", "how the default aclserver starts: zygote (fork, fast) or spawn"),
    DaemonFlag("ready-timeout", "10", "seconds to wait for a new aclserver's ready file"),
    DaemonFlag("stop-timeout", "2", "seconds between SIGTERM and SIGKILL of an aclserver group"),
    DaemonFlag(
        "monitor-interval",
        "0.5",
        "seconds between liveness checks when exit notification (pidfd) is unavailable or an exit is pending",
    ),
    DaemonFlag("max-restarts", "1", "times a dead aclserver is restarted (0 = never)"),
    DaemonFlag(
        "max-sessions",
        str(DEFAULT_MAX_SESSIONS),
        "concurrent client sessions one claim's aclserver serves (any processes of the pod; 1..1024)",
    ),
    DaemonFlag(
        "shm-mount",
        "auto",
        "give each claim's shm dir its own size-limited tmpfs: auto (when it reaches the containers: the"
        " daemon runs in the host's mount namespace, or the shm root is a shared mount; otherwise shares"
        " are refused, saying why), always, never (plain dirs: a container can fill the node's /dev/shm)",
    ),
    DaemonFlag(
        "cgroups",
        "auto",
        "run each aclserver in its own bounded cgroup outside the daemon's: auto (when the cgroup root"
        " is writable; otherwise unbounded in the daemon's cgroup, with a warning), always (refuse to"
        " start without), never",
    ),
    DaemonFlag(
        "cgroup-root",
        "/sys/fs/cgroup",
        "where the host's cgroup file system is mounted (cgroup v2, or v1 hierarchies under it)",
    ),
    DaemonFlag(
        "cgroup-parent",
        cgroup_layout.DEFAULT_PARENT,
        "driver-owned cgroup, below each hierarchy's root, of the aclservers' aclserver-<claim uid> cgroups",
    ),
    DaemonFlag(
        "aclserver-memory-overhead-mib",
        str(bounds.DEFAULT_MEMORY_OVERHEAD_BYTES >> 20),
        "an aclserver's memory bound beyond its claim's memory quota, hostMemory and staging regions (MiB)",
    ),
    DaemonFlag(
        "instance", "", "this daemon instance's name in Health and logs (the chart passes the pod UID)"
    ),
)


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    socket: Path
    settings: Settings
    aclserver_command: tuple[str, ...]
    use_zygote: bool
    inventory: Path | None
    npu_smi: str
    log_level: str
    log_json: bool
    cgroups: str = "auto"
    cgroup_root: Path = Path("/sys/fs/cgroup")
    cgroup_parent: str = cgroup_layout.DEFAULT_PARENT
    instance: str = ""
    rediscover_seconds: float = 30.0


def build_config(argv: Sequence[str] | None, env: Mapping[str, str]) -> DaemonConfig:
    """Flags > environment > defaults; raises InvalidInput (code InvalidConfig) for bad values."""
    parser = argparse.ArgumentParser(prog="flexnpu-daemon", description=__doc__)
    config.add_flags(parser, FLAGS)
    values = config.resolve(parser.parse_args(argv), env, FLAGS)

    def path(key: str) -> Path:
        raw = values[key]
        assert raw is not None
        return Path(raw).absolute()

    def number(key: str, *, low: float = 0.0) -> float:
        raw = values[key]
        try:
            value = float(raw or "")
        except ValueError:
            value = -1.0
        if value < low:
            flag = key.replace("_", "-")
            raise InvalidInput(
                f"expected a number >= {low}, got {raw!r}", code=ErrorCode.INVALID_CONFIG, field=flag
            )
        return value

    custom = values["aclserver_command"]
    command = tuple(shlex.split(custom or DEFAULT_ACLSERVER_COMMAND))
    if not command:
        raise InvalidInput("must not be empty", code=ErrorCode.INVALID_CONFIG, field="aclserver-command")
    launcher = values["launcher"] or "zygote"
    if launcher not in ("zygote", "spawn"):
        raise InvalidInput(
            f"unknown launcher {launcher!r}; use zygote or spawn",
            code=ErrorCode.INVALID_CONFIG,
            field="launcher",
        )
    inventory = values["inventory"]
    max_sessions = int(number("max_sessions", low=1))
    if max_sessions > 1024:
        raise InvalidInput(
            f"must be at most 1024, got {max_sessions}", code=ErrorCode.INVALID_CONFIG, field="max-sessions"
        )
    shared = config.SharedSettings.from_values(values)

    def mode(key: str) -> str:
        """An auto|always|never flag's value (default auto)."""
        value = values[key] or "auto"
        if value not in ("auto", "always", "never"):
            raise InvalidInput(
                f"unknown value {value!r}; use auto, always or never",
                code=ErrorCode.INVALID_CONFIG,
                field=key.replace("_", "-"),
            )
        return value

    shm_mount = mode("shm_mount")
    log_json = (values["log_json"] or "").strip().lower() in ("1", "true", "yes", "on")
    bound = shmroot.decide(
        shm_mount,
        root=shared.shm_root,
        may_mount=shm_mount == "auto" and shmroot.may_mount(),
        runtime_namespace=shm_mount == "auto" and shmroot.in_runtime_namespace(),
        shared=shm_mount == "auto" and shmroot.propagates(shared.shm_root),
    )
    cgroup_mode = mode("cgroups")
    parent = values["cgroup_parent"] or cgroup_layout.DEFAULT_PARENT
    bad_parent = cgroup_layout.check_parent(parent)
    if bad_parent:
        raise InvalidInput(bad_parent, code=ErrorCode.INVALID_CONFIG, field="cgroup-parent")
    overhead = int(number("aclserver_memory_overhead_mib")) << 20
    return DaemonConfig(
        socket=path("socket"),
        settings=Settings(
            state_dir=path("state_dir"),
            run_dir=shared.run_dir,
            shm_root=shared.shm_root,
            tcp_host=values["tcp_host"] or "127.0.0.1",
            ready_timeout=number("ready_timeout", low=0.1),
            stop_timeout=number("stop_timeout"),
            monitor_interval=number("monitor_interval", low=0.01),
            max_restarts=int(number("max_restarts")),
            max_sessions=max_sessions,
            max_shares_per_die=shared.max_shares_per_die,
            shm_mount=bound.mount,
            shm_problem=bound.problem,
            memory_overhead_bytes=overhead,
        ),
        aclserver_command=command,
        use_zygote=launcher == "zygote" and not custom,
        inventory=Path(inventory).absolute() if inventory else None,
        npu_smi=values["npu_smi"] or "npu-smi",
        rediscover_seconds=number("rediscover_seconds"),
        log_level=values["log_level"] or "INFO",
        log_json=log_json,
        cgroups=cgroup_mode,
        cgroup_root=path("cgroup_root"),
        cgroup_parent=parent,
        instance=values["instance"] or "",
    )


def open_cgroups(cfg: DaemonConfig) -> tuple[cgroups.Cgroups | None, str]:
    """The claims' cgroups, or None and why aclservers run unbounded (``--cgroups always``: raise)."""
    if cfg.cgroups == "never":
        return None, "turned off (--cgroups never)"
    found, problem = cgroups.open_cgroups(cfg.cgroup_root, cfg.cgroup_parent)
    if found is None and cfg.cgroups == "always":
        raise FlexNPUError(f"--cgroups always: {problem}", code=ErrorCode.CGROUP_FAILED, field="cgroups")
    return found, problem


def load_dies(cfg: DaemonConfig) -> dict[int, DieCapacity]:
    """The node's dies, by physical ID, from the emulated inventory or npu-smi."""
    inventory = discovery.from_config(inventory=cfg.inventory, npu_smi=cfg.npu_smi).discover()
    return {
        d.phy_id: DieCapacity(
            phy_id=d.phy_id, memory_bytes=d.memory_bytes, healthy=d.health != Health.UNHEALTHY
        )
        for d in inventory.dies
    }


def rediscover(cfg: DaemonConfig, manager: Manager, stop: threading.Event) -> None:
    """Discover the dies again every ``--rediscover-seconds`` and serve what is there now (the node
    process publishes a new die for shares only once this daemon reports it, in ``Health``)."""
    while not stop.wait(cfg.rediscover_seconds):
        try:
            dies = load_dies(cfg)
        except FlexNPUError as err:
            log.warning("rediscovery failed, keeping the dies %s: %s", sorted(manager.dies), err)
            continue
        except Exception:
            log.exception("rediscovery: unexpected error; keeping the dies %s", sorted(manager.dies))
            continue
        if dies != manager.dies:
            added, removed = manager.set_dies(dies)
            log.warning(
                "dies changed: added %s, removed %s, now serving %s (aclservers on removed dies keep running)",
                list(added),
                list(removed),
                sorted(dies),
            )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg = build_config(argv, os.environ)
    except InvalidInput as exc:
        print(f"flexnpu-daemon: {exc}", file=sys.stderr)
        return 2
    logs.setup(cfg.log_level, json_format=cfg.log_json)
    stop = threading.Event()

    def on_signal(signum: int) -> None:
        log.info("received %s: stopping (aclservers keep running)", signal.Signals(signum).name)
        stop.set()

    handle_signals(on_signal)
    with instance.held(cfg.settings.lock_file, stop, instance=cfg.instance) as owner:
        if not owner:
            log.info("stopped before this instance got %s", cfg.settings.lock_file)
            return 0
        return _serve(cfg, stop)


def _serve(cfg: DaemonConfig, stop: threading.Event) -> int:
    """Everything after the instance lock: cgroups, dies, recovery, the API, the monitor."""
    try:
        install = ownership.install_id(cfg.settings.state_dir)
        claim_cgroups, cgroup_problem = open_cgroups(cfg)
        if claim_cgroups is not None:
            claim_cgroups.owner = install
        dies = load_dies(cfg)
        spawn = SpawnLauncher(cfg.aclserver_command)
        launcher: Launcher = spawn
        if cfg.use_zygote:
            zygote = ZygoteLauncher(run_dir=cfg.settings.run_dir, fallback=spawn)
            zygote.start()
            launcher = zygote
        manager = Manager(
            cfg.settings,
            dies,
            launcher,
            cgroups=claim_cgroups,
            cgroup_problem=cgroup_problem,
            instance=cfg.instance,
            install=install,
        )
        report = manager.recover()
        log.info("recovered: %s", report.describe())
        server = service.serve(manager, cfg.socket)
    except FlexNPUError as exc:
        log.error("cannot start: %s", exc)
        return 1
    manager.start_monitor()
    if cfg.rediscover_seconds > 0:
        threading.Thread(target=rediscover, args=(cfg, manager, stop), name="rediscover", daemon=True).start()
    if cfg.settings.shm_problem:
        log.error("shares are refused on this node: %s", cfg.settings.shm_problem)
    elif not cfg.settings.shm_mount:
        log.warning(
            "claims' shm dirs under %s are plain directories (--shm-mount never): a container can fill the"
            " node's /dev/shm",
            cfg.settings.shm_root,
        )
    if claim_cgroups is None:
        log.warning(
            "aclservers run in the daemon's own cgroup, unbounded, and die with its container: %s",
            cgroup_problem,
        )
    else:
        log.info("each aclserver gets its own cgroup: %s", claim_cgroups.describe())
    log.info("serving on %s with %d dies", cfg.socket, len(dies))
    while not stop.wait(SIGNAL_CHECK_SECONDS):
        pass  # a short wait, not one without end: see SIGNAL_CHECK_SECONDS
    server.stop(grace=1.0).wait()
    manager.stop_monitor()
    launcher.close()
    cfg.socket.unlink(missing_ok=True)
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
