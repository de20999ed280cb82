"""One configuration object, built once per process from flags and their ``FLEXNPU_…`` twins.

Precedence: command-line flag > environment variable > default. After :func:`build`
returns, nothing in the driver reads ``os.environ`` for configuration.

This module owns the flag machinery (:class:`Flag`, :func:`add_flags`, :func:`resolve`), the node
process's flags (``PLUGIN_FLAGS``), the webhook's, and the flags node and daemon share
(``SHARED_FLAGS``: run dir, shm root, share limit), declared once with their default, help and
validation (:class:`SharedSettings`), so the two processes cannot disagree on them. The daemon's
own flags are in ``flexnpu_runtime/daemon/main.py``; they take the shared ones from here.
"""

from __future__ import annotations

import argparse
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from dra_driver import DEFAULT_DRIVER_NAME, sharing
from dra_driver.errors import ErrorCode, InvalidInput
from dra_driver.placement import Placement
from dra_kubeletplugin import sockets
from flexnpu_wire.launch import DEFAULT_MAX_SHARES_PER_DIE
from flexnpu_wire.shares import MAX_HOST_MEMORY_BYTES

DEFAULT_CLIENT_LIBRARY = "/usr/lib/flexnpu/libascendcl.so"
"""Where ``make -C libascendcl install PREFIX=/usr/lib/flexnpu`` puts the C client on a node."""


@dataclass(frozen=True, slots=True)
class Flag:
    """One flag: ``--<name>`` and its environment twin ``<env_prefix><NAME>``.

    ``aliases`` are old spellings kept working: each is a flag (``--<alias>``) and has an
    environment twin of its own, read after the canonical one. ``standard_env`` is a variable another
    project defines for the same setting (OpenTelemetry's ``OTEL_EXPORTER_OTLP_ENDPOINT``), read last.
    """

    name: str  # without leading dashes
    default: str | None
    help: str
    kind: type = str
    aliases: tuple[str, ...] = ()
    env_prefix: str = "FLEXNPU_"
    standard_env: str | None = None

    @property
    def env(self) -> str:
        return self.env_prefix + self.name.upper().replace("-", "_")

    @property
    def envs(self) -> tuple[str, ...]:
        """Every environment twin, the canonical one first."""
        return (self.env, *(self.env_prefix + a.upper().replace("-", "_") for a in self.aliases))

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    def with_env_prefix(self, prefix: str) -> Flag:
        """The same flag with its environment twins under ``prefix`` (the daemon's ``FLEXNPU_DAEMON_``)."""
        return replace(self, env_prefix=prefix)


MAX_SHARES_LIMIT = 1024
"""The most aclservers one die's ledger has slots for (``flexnpu_runtime/aclserver/ledger.py``)."""

RUN_DIR = Flag(
    "run-dir",
    "/var/run/flexnpu",
    "runtime directory on tmpfs, the same for node and daemon: per-claim client.conf, the daemon socket,"
    " aclserver specs, ready files and stderr logs (under aclservers/)",
)
SHM_ROOT = Flag(
    "shm-root",
    "/dev/shm/flexnpu",
    "parent of per-claim shared-memory directories, the same for node and daemon",
    aliases=("shm-dir",),
)
MAX_SHARES_PER_DIE = Flag(
    "max-shares-per-die",
    str(DEFAULT_MAX_SHARES_PER_DIE),
    f"most soft shares (aclservers, however many vNPUs each) one die serves, the same for node and daemon:"
    f" the node publishes it as each share device's `shares` capacity, the daemon's ledger admits as many"
    f" (1..{MAX_SHARES_LIMIT})",
)
HOST_MEMORY_RATIO = Flag(
    "host-memory-ratio",
    f"{sharing.DEFAULT_HOST_MEMORY_RATIO:g}",
    "most host memory (VnpuConfig hostMemory) a share request may ask for, as a multiple of its device memory,"
    f" the same for node and webhook (1..{sharing.MAX_HOST_MEMORY_RATIO:g}; its device memory is always allowed)",
)
MAX_HOST_MEMORY = Flag(
    "max-host-memory",
    f"{sharing.DEFAULT_MAX_HOST_MEMORY >> 30}Gi",
    "most host memory (VnpuConfig hostMemory) one share request may ask for beyond its device memory,"
    " a quantity (64Gi), the same for node and webhook",
)
HOST_MEMORY_FLAGS: tuple[Flag, ...] = (HOST_MEMORY_RATIO, MAX_HOST_MEMORY)
"""The bound on a claim's hostMemory (``dra_driver.sharing.HostMemoryBound``): prepare and the webhook enforce it."""


def host_memory_bound(values: Mapping[str, str | None]) -> sharing.HostMemoryBound:
    """:data:`HOST_MEMORY_FLAGS`' values as a bound; raises InvalidInput (InvalidConfig) naming the flag."""
    raw = values.get(HOST_MEMORY_RATIO.dest) or HOST_MEMORY_RATIO.default
    try:
        ratio = float(raw or "")
    except ValueError:
        ratio = 0.0
    if not 1 <= ratio <= sharing.MAX_HOST_MEMORY_RATIO:
        raise InvalidInput(
            f"expected a ratio 1..{sharing.MAX_HOST_MEMORY_RATIO:g}, got {raw!r}",
            code=ErrorCode.INVALID_CONFIG,
            field=HOST_MEMORY_RATIO.name,
        )
    raw = values.get(MAX_HOST_MEMORY.dest) or MAX_HOST_MEMORY.default
    try:
        cap = sharing.parse_quantity(str(raw), claim_uid="", field=MAX_HOST_MEMORY.name)
    except InvalidInput:
        cap = 0
    if not sharing.MIN_HOST_MEMORY_BYTES <= cap <= MAX_HOST_MEMORY_BYTES:
        raise InvalidInput(
            f"expected a quantity 1Mi..1Ti such as 64Gi, got {raw!r}",
            code=ErrorCode.INVALID_CONFIG,
            field=MAX_HOST_MEMORY.name,
        )
    return sharing.HostMemoryBound(ratio=ratio, cap_bytes=cap)


OTLP_ENDPOINT = Flag(
    "otlp-endpoint",
    None,
    "OpenTelemetry collector to send trace spans to over OTLP/HTTP (protobuf): a base URL such as"
    " http://otel-collector:4318 (spans go to its /v1/traces) or the full traces URL; none or '' = spans"
    " leave the process nowhere",
    standard_env="OTEL_EXPORTER_OTLP_ENDPOINT",
)
"""Where the node and the extender export their spans (``dra_driver/telemetry/tracing.py``)."""


def otlp_endpoint(values: Mapping[str, str | None]) -> str:
    """:data:`OTLP_ENDPOINT`'s value: '' (off) or an http(s) URL with a host; InvalidInput naming the flag."""
    raw = (values.get(OTLP_ENDPOINT.dest) or "").strip()
    if not raw:
        return ""
    try:
        url = urllib.parse.urlsplit(raw)
        port_ok = url.port is None or url.port > 0
    except ValueError:
        url, port_ok = None, False
    if (
        url is None
        or url.scheme not in ("http", "https")
        or not url.hostname
        or not port_ok
        or any(c.isspace() or not c.isprintable() for c in raw)
    ):
        raise InvalidInput(
            f"expected an http:// or https:// URL of an OTLP/HTTP collector such as"
            f" http://otel-collector:4318, or '' for none, got {raw!r}",
            code=ErrorCode.INVALID_CONFIG,
            field=OTLP_ENDPOINT.name,
        )
    return raw


SHARED_FLAGS: tuple[Flag, ...] = (RUN_DIR, SHM_ROOT, MAX_SHARES_PER_DIE)
"""The flags node and daemon share, declared once; each parser adds them (the daemon under its prefix)."""


@dataclass(frozen=True, slots=True)
class SharedSettings:
    """The values of ``SHARED_FLAGS``, validated the one way both processes use."""

    run_dir: Path
    shm_root: Path
    max_shares_per_die: int

    @classmethod
    def from_values(cls, values: Mapping[str, str | None]) -> SharedSettings:
        """From :func:`resolve`'s output; raises InvalidInput (InvalidConfig) naming the flag."""
        return cls(
            run_dir=_dir(RUN_DIR, values.get(RUN_DIR.dest)),
            shm_root=_dir(SHM_ROOT, values.get(SHM_ROOT.dest)),
            max_shares_per_die=_max_shares(values.get(MAX_SHARES_PER_DIE.dest)),
        )


def _dir(flag: Flag, value: str | None) -> Path:
    """A directory flag's value, made absolute against the working directory."""
    if not value or "\0" in value:
        raise InvalidInput(
            f"expected a directory path, got {value!r}", code=ErrorCode.INVALID_CONFIG, field=flag.name
        )
    return Path(value).absolute()


def _max_shares(value: str | None) -> int:
    try:
        number = float(value or "")
    except ValueError:
        number = 0.0
    if number != int(number) or not 1 <= number <= MAX_SHARES_LIMIT:
        raise InvalidInput(
            f"expected a whole number of shares 1..{MAX_SHARES_LIMIT}, got {value!r}",
            code=ErrorCode.INVALID_CONFIG,
            field=MAX_SHARES_PER_DIE.name,
        )
    return int(number)


PLUGIN_FLAGS: tuple[Flag, ...] = (
    Flag("node-name", None, "Kubernetes node name (required; usually from the downward API)"),
    Flag("kubeconfig", None, "path to a kubeconfig; in-cluster config when absent"),
    Flag("driver-name", DEFAULT_DRIVER_NAME, "DRA driver name published in slices and registration"),
    Flag("inventory", None, "emulated inventory file (YAML/JSON); when absent, discover with npu-smi"),
    Flag("npu-smi", "npu-smi", "npu-smi executable used when no --inventory is given"),
    Flag("kubelet-registry-dir", "/var/lib/kubelet/plugins_registry", "kubelet plugin watcher dir"),
    Flag("kubelet-plugins-dir", "/var/lib/kubelet/plugins", "parent of the per-driver DRA socket dir"),
    Flag("state-dir", "/var/lib/flexnpu", "checkpoint directory (persistent)"),
    RUN_DIR,
    SHM_ROOT,
    Flag("cdi-dir", "/var/run/cdi", "directory for transient CDI specs"),
    Flag(
        "device-root", "/", "prefix for device nodes and driver paths (an emulated node points at a temp dir)"
    ),
    Flag(
        "build-device-root",
        "false",
        "with --inventory: create the emulated device nodes and driver files under --device-root at start, "
        "so containers start on a node without NPUs (true|false; refused for device root /)",
    ),
    Flag("cdi-kind", "flexnpu.io/vnpu", "CDI kind (vendor/class) of the specs this driver writes"),
    Flag(
        "default-mode",
        "both",
        "how dies are handed out when not configured per die: whole|soft|hard|both|all (both = whole and shares, all = whole, shares and hard-split templates, kept apart by counters)",
    ),
    Flag("log-level", "INFO", "log level"),
    Flag("log-json", "false", "log JSON lines instead of text (true|false)"),
    Flag("slice-resync-seconds", "600", "periodic full slice resync, in seconds (0 = only on watch events)"),
    Flag("pod-uid", None, "plugin pod UID; enables unique sockets for rolling updates"),
    Flag("metrics-port", "-1", "Prometheus metrics port (negative = disabled)"),
    Flag(
        "latency-delay-bound-ms",
        "2",
        "p99 queueing delay a latency-critical vNPU should stay under (flexnpu_vnpu_pod_queue_delay_bound_seconds,"
        " alert FlexNPULatencyCriticalQueueing)",
    ),
    Flag("daemon-socket", None, "flexnpu-daemon unix socket (default <run-dir>/daemon.sock)"),
    Flag("daemon-retry-seconds", "30", "how long prepare retries an unreachable daemon (< kubelet's 45 s)"),
    Flag(
        "control-link",
        "flexnpu0",
        "host link the aclservers' TCP control link listens on ('' = loopback only)",
    ),
    Flag("control-link-cidr", "169.254.213.1/24", "address/prefix of the control link"),
    Flag("control-link-kind", "bridge", "kind of the control link: bridge|tap"),
    Flag(
        "residual-grace-seconds",
        "300",
        "a prepared claim with no consumer in reservedFor this long is residual",
    ),
    Flag("reconcile-period-seconds", "60", "period of the residual reconciler's full pass (jittered ±20 %)"),
    MAX_SHARES_PER_DIE,
    *HOST_MEMORY_FLAGS,
    Flag(
        "rediscover-seconds",
        "30",
        "how often dies are discovered again for health and inventory changes (0 = never)",
    ),
    Flag(
        "placement",
        "binpack",
        "die-level placement policy: the order this node lists its devices in, from the capacity allocated"
        " on each die (binpack = most-used die first, keeps whole dies free; spread = least-used first)",
    ),
    Flag(
        "placement-writes-per-second",
        "4",
        "most slice rewrites per second for a changed device order (coalesced; 0 = never reorder)",
    ),
    OTLP_ENDPOINT,
    Flag(
        "client-library",
        DEFAULT_CLIENT_LIBRARY,
        "host path of FlexNPU's libascendcl.so client that share CDI specs inject (its ld.so.preload beside it)",
    ),
)


@dataclass(frozen=True, slots=True)
class Paths:
    kubelet_registry_dir: Path
    kubelet_plugins_dir: Path
    state_dir: Path
    run_dir: Path
    shm_root: Path
    cdi_dir: Path
    device_root: Path

    @property
    def checkpoint_file(self) -> Path:
        return self.state_dir / "checkpoint.json"


@dataclass(frozen=True, slots=True)
class Config:
    node_name: str
    driver_name: str
    kubeconfig: str | None
    inventory: Path | None
    npu_smi: str
    paths: Paths
    cdi_kind: str
    default_mode: str
    log_level: str
    log_json: bool
    slice_resync_seconds: float
    pod_uid: str | None = None
    metrics_port: int = -1
    latency_delay_bound_seconds: float = 0.002
    daemon_socket: Path | None = None
    daemon_retry_seconds: float = 30.0
    control_link: str = "flexnpu0"
    control_link_cidr: str = "169.254.213.1/24"
    control_link_kind: str = "bridge"
    residual_grace_seconds: float = 300.0
    reconcile_period_seconds: float = 60.0
    rediscover_seconds: float = 30.0
    build_device_root: bool = False
    client_library: Path = Path(DEFAULT_CLIENT_LIBRARY)
    max_shares_per_die: int = DEFAULT_MAX_SHARES_PER_DIE
    placement: Placement = Placement.BINPACK
    placement_writes_per_second: float = 4.0
    host_memory: sharing.HostMemoryBound = field(default_factory=sharing.HostMemoryBound)
    otlp_endpoint: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def socket_paths(self) -> sockets.Sockets:
        """The plugin's socket paths, named by the kubelet-plugin helper (per instance with a pod UID)."""
        return sockets.plugin_sockets(
            self.driver_name,
            pod_uid=self.pod_uid,
            registry_dir=self.paths.kubelet_registry_dir,
            plugins_dir=self.paths.kubelet_plugins_dir,
        )

    @property
    def plugin_dir(self) -> Path:
        return self.socket_paths.plugin_dir

    @property
    def dra_socket(self) -> Path:
        return self.socket_paths.dra

    @property
    def registration_socket(self) -> Path:
        return self.socket_paths.registration

    @property
    def pool_name(self) -> str:
        return self.node_name


def add_flags(parser: argparse.ArgumentParser, flags: Sequence[Flag] = PLUGIN_FLAGS) -> None:
    """Add each flag; the help text names its environment twin and default.

    argparse %-formats help strings, so a literal ``%`` in a flag's text or default is escaped here.
    """
    for f in flags:
        also = f", else {f.standard_env}" if f.standard_env else ""
        text = f"{f.help} (env {f.env}{also}; default {f.default!r})"
        if f.aliases:
            old = ", ".join(f"--{a} / {e}" for a, e in zip(f.aliases, f.envs[1:], strict=True))
            text += f"; old spellings {old} still work"
        parser.add_argument(
            f"--{f.name}",
            *(f"--{a}" for a in f.aliases),
            dest=f.dest,
            default=None,
            help=text.replace("%", "%%"),
        )


def from_args_namespace(flags: Sequence[Flag] = PLUGIN_FLAGS) -> argparse.Namespace:
    """A namespace with no flag given, for callers that read only the environment twins (dra_driver/probes.py)."""
    return argparse.Namespace(**{f.dest: None for f in flags})


def resolve(
    ns: argparse.Namespace, env: Mapping[str, str], flags: Sequence[Flag] = PLUGIN_FLAGS
) -> dict[str, str | None]:
    """flag > environment > default, for every flag."""
    out: dict[str, str | None] = {}
    for f in flags:
        value = getattr(ns, f.dest, None)
        for name in (*f.envs, *((f.standard_env,) if f.standard_env else ())):
            if value is None:
                value = env.get(name)
        if value is None:
            value = f.default
        out[f.dest] = value
    return out


def _bool(name: str, value: str | None) -> bool:
    v = (value or "").strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("", "0", "false", "no", "off"):
        return False
    raise InvalidInput(f"expected true or false, got {value!r}", code=ErrorCode.INVALID_CONFIG, field=name)


def _number(name: str, value: str | None) -> float:
    try:
        return float(value or "0")
    except ValueError:
        raise InvalidInput(
            f"expected a number, got {value!r}", code=ErrorCode.INVALID_CONFIG, field=name
        ) from None


def build(values: Mapping[str, str | None]) -> Config:
    node = values.get("node_name")
    if not node:
        raise InvalidInput(
            "a node name is required (--node-name or FLEXNPU_NODE_NAME)",
            code=ErrorCode.INVALID_CONFIG,
            field="node-name",
        )
    mode = values.get("default_mode") or "both"
    if mode not in ("whole", "soft", "both", "hard", "all"):
        raise InvalidInput(
            f"unknown mode {mode!r}; use whole, soft, both, hard or all",
            code=ErrorCode.INVALID_CONFIG,
            field="default-mode",
        )

    def path(key: str) -> Path:
        raw = values.get(key)
        assert raw is not None
        p = Path(raw)
        if not p.is_absolute():
            p = Path.cwd() / p
        return p

    inventory = values.get("inventory")
    build_root = _bool("build-device-root", values.get("build_device_root"))
    delay_bound_ms = _number("latency-delay-bound-ms", values.get("latency_delay_bound_ms") or "2")
    if not delay_bound_ms > 0:
        raise InvalidInput(
            f"must be a positive number of milliseconds, got {values.get('latency_delay_bound_ms')!r}",
            code=ErrorCode.INVALID_CONFIG,
            field="latency-delay-bound-ms",
        )
    shared = SharedSettings.from_values(values)
    return Config(
        node_name=node,
        driver_name=values.get("driver_name") or DEFAULT_DRIVER_NAME,
        kubeconfig=values.get("kubeconfig") or None,
        inventory=Path(inventory).absolute() if inventory else None,
        npu_smi=values.get("npu_smi") or "npu-smi",
        paths=Paths(
            kubelet_registry_dir=path("kubelet_registry_dir"),
            kubelet_plugins_dir=path("kubelet_plugins_dir"),
            state_dir=path("state_dir"),
            run_dir=shared.run_dir,
            shm_root=shared.shm_root,
            cdi_dir=path("cdi_dir"),
            device_root=path("device_root"),
        ),
        cdi_kind=values.get("cdi_kind") or "flexnpu.io/vnpu",
        default_mode=mode,
        log_level=values.get("log_level") or "INFO",
        log_json=_bool("log-json", values.get("log_json")),
        slice_resync_seconds=_number("slice-resync-seconds", values.get("slice_resync_seconds")),
        pod_uid=values.get("pod_uid") or None,
        metrics_port=int(_number("metrics-port", values.get("metrics_port"))),
        latency_delay_bound_seconds=delay_bound_ms / 1000,
        daemon_socket=path("daemon_socket")
        if values.get("daemon_socket")
        else shared.run_dir / "daemon.sock",
        daemon_retry_seconds=_number("daemon-retry-seconds", values.get("daemon_retry_seconds") or "30"),
        control_link=values.get("control_link") or "",
        control_link_cidr=values.get("control_link_cidr") or "169.254.213.1/24",
        control_link_kind=values.get("control_link_kind") or "bridge",
        residual_grace_seconds=_number(
            "residual-grace-seconds", values.get("residual_grace_seconds") or "300"
        ),
        reconcile_period_seconds=_number(
            "reconcile-period-seconds", values.get("reconcile_period_seconds") or "60"
        ),
        rediscover_seconds=_number("rediscover-seconds", values.get("rediscover_seconds") or "30"),
        build_device_root=build_root,
        client_library=path("client_library")
        if values.get("client_library")
        else Path(DEFAULT_CLIENT_LIBRARY),
        max_shares_per_die=shared.max_shares_per_die,
        placement=Placement.parse(values.get("placement") or "binpack"),
        placement_writes_per_second=_rate(
            "placement-writes-per-second", values.get("placement_writes_per_second") or "4"
        ),
        host_memory=host_memory_bound(values),
        otlp_endpoint=otlp_endpoint(values),
    )


def _rate(name: str, value: str | None) -> float:
    rate = _number(name, value)
    if not 0 <= rate <= 100:
        raise InvalidInput(
            f"expected 0..100 writes per second, got {value!r}", code=ErrorCode.INVALID_CONFIG, field=name
        )
    return rate


def _server_flags(why_tls: str) -> tuple[Flag, ...]:
    """The TLS and logging flags of an HTTPS server subcommand (webhook, extender)."""
    return (
        Flag("tls-cert-file", None, f"serving certificate (PEM); {why_tls} ('' = plain HTTP, for tests)"),
        Flag("tls-key-file", None, "private key of the serving certificate (PEM)"),
        Flag("log-level", "INFO", "log level"),
        Flag("log-json", "false", "log JSON lines instead of text (true|false)"),
    )


def _tls_and_port(
    values: Mapping[str, str | None], port_flag: str, default_port: str
) -> tuple[Path | None, Path | None, int]:
    """(certificate, key, port) of an HTTPS server subcommand; InvalidInput naming the flag."""
    cert, key = values.get("tls_cert_file") or None, values.get("tls_key_file") or None
    if bool(cert) != bool(key):
        raise InvalidInput(
            "give both --tls-cert-file and --tls-key-file, or neither",
            code=ErrorCode.INVALID_CONFIG,
            field="tls-key-file" if cert else "tls-cert-file",
        )
    port = _number(port_flag, values.get(port_flag.replace("-", "_")) or default_port)
    if port != int(port) or not 0 <= port <= 65535:
        raise InvalidInput(
            f"expected a port 0..65535, got {port!r}", code=ErrorCode.INVALID_CONFIG, field=port_flag
        )
    return (Path(cert).absolute() if cert else None, Path(key).absolute() if key else None, int(port))


WEBHOOK_FLAGS: tuple[Flag, ...] = (
    Flag("driver-name", DEFAULT_DRIVER_NAME, "DRA driver name whose opaque configs are checked"),
    Flag(
        "share-classes",
        "vnpu.flexnpu.io",
        "comma-separated DeviceClasses of soft-split shares, each optionally =<policy> its devices serve"
        " (a request's vnpus must divide its memory and compute; a config's policy must be its class's)",
    ),
    Flag("webhook-host", "0.0.0.0", "address the admission webhook listens on"),
    Flag("webhook-port", "8443", "HTTPS port of the admission webhook"),
    *HOST_MEMORY_FLAGS,
    *_server_flags("the API server needs TLS"),
)


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """``flexnpu-dra webhook``: the validating admission webhook for VnpuConfig."""

    driver_name: str
    share_classes: tuple[str, ...]
    host: str
    port: int
    tls_cert: Path | None
    tls_key: Path | None
    log_level: str = "INFO"
    log_json: bool = False
    host_memory: sharing.HostMemoryBound = field(default_factory=sharing.HostMemoryBound)


def build_webhook(values: Mapping[str, str | None]) -> WebhookConfig:
    cert, key, port = _tls_and_port(values, "webhook-port", "8443")
    classes = tuple(c.strip() for c in (values.get("share_classes") or "").split(",") if c.strip())
    if not classes:
        raise InvalidInput(
            "name at least one share class", code=ErrorCode.INVALID_CONFIG, field="share-classes"
        )
    return WebhookConfig(
        driver_name=values.get("driver_name") or DEFAULT_DRIVER_NAME,
        share_classes=classes,
        host=values.get("webhook_host") or "0.0.0.0",
        port=port,
        tls_cert=cert,
        tls_key=key,
        log_level=values.get("log_level") or "INFO",
        log_json=_bool("log-json", values.get("log_json")),
        host_memory=host_memory_bound(values),
    )


EXTENDER_FLAGS: tuple[Flag, ...] = (
    Flag("driver-name", DEFAULT_DRIVER_NAME, "DRA driver whose allocated devices the extender counts"),
    Flag("kubeconfig", None, "path to a kubeconfig; in-cluster config when absent"),
    Flag(
        "placement",
        "binpack",
        "node-level policy of pods without the npu.flexnpu.io/placement annotation: binpack (fullest"
        " node first) or spread (emptiest first)",
    ),
    Flag("extender-host", "0.0.0.0", "address the scheduler extender listens on"),
    Flag("extender-port", "8444", "HTTPS port of the scheduler extender"),
    OTLP_ENDPOINT,
    *_server_flags("kube-scheduler's enableHTTPS needs TLS"),
)


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    """``flexnpu-dra extender``: the kube-scheduler extender that ranks nodes by NPU fill."""

    driver_name: str
    kubeconfig: str | None
    placement: Placement
    host: str
    port: int
    tls_cert: Path | None
    tls_key: Path | None
    log_level: str = "INFO"
    log_json: bool = False
    otlp_endpoint: str = ""


def build_extender(values: Mapping[str, str | None]) -> ExtenderConfig:
    cert, key, port = _tls_and_port(values, "extender-port", "8444")
    return ExtenderConfig(
        driver_name=values.get("driver_name") or DEFAULT_DRIVER_NAME,
        kubeconfig=values.get("kubeconfig") or None,
        placement=Placement.parse(values.get("placement") or "binpack"),
        host=values.get("extender_host") or "0.0.0.0",
        port=port,
        tls_cert=cert,
        tls_key=key,
        log_level=values.get("log_level") or "INFO",
        log_json=_bool("log-json", values.get("log_json")),
        otlp_endpoint=otlp_endpoint(values),
    )
