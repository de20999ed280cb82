"""Config: every flag has an environment twin that reaches the Config object; precedence; bad values."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from dra_driver import config
from dra_driver.config import Config
from dra_driver.errors import ErrorCode, InvalidInput
from dra_driver.placement import Placement


def from_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    """The plugin's flags (with environment twins) as ``flexnpu-dra plugin`` reads them (kubeletplugin/cli.py)."""
    parser = argparse.ArgumentParser(prog="flexnpu-dra plugin")
    config.add_flags(parser)
    return config.build(config.resolve(parser.parse_args(argv), os.environ if env is None else env))


# flag name -> (a non-default value, how to read it back from Config)
READ: dict[str, tuple[str, Callable[[Config], Any], Any]] = {
    "node-name": ("n7", lambda c: c.node_name, "n7"),
    "kubeconfig": ("/k/cfg", lambda c: c.kubeconfig, "/k/cfg"),
    "driver-name": ("npu.example.com", lambda c: c.driver_name, "npu.example.com"),
    "inventory": ("/inv.yaml", lambda c: c.inventory, Path("/inv.yaml")),
    "npu-smi": ("/opt/npu-smi", lambda c: c.npu_smi, "/opt/npu-smi"),
    "kubelet-registry-dir": ("/r", lambda c: c.paths.kubelet_registry_dir, Path("/r")),
    "kubelet-plugins-dir": ("/p", lambda c: c.paths.kubelet_plugins_dir, Path("/p")),
    "state-dir": ("/s", lambda c: c.paths.state_dir, Path("/s")),
    "run-dir": ("/run/x", lambda c: c.paths.run_dir, Path("/run/x")),
    "shm-root": ("/dev/shm/x", lambda c: c.paths.shm_root, Path("/dev/shm/x")),
    "cdi-dir": ("/etc/cdi", lambda c: c.paths.cdi_dir, Path("/etc/cdi")),
    "device-root": ("/emu", lambda c: c.paths.device_root, Path("/emu")),
    "cdi-kind": ("example.com/npu", lambda c: c.cdi_kind, "example.com/npu"),
    "default-mode": ("soft", lambda c: c.default_mode, "soft"),
    "log-level": ("DEBUG", lambda c: c.log_level, "DEBUG"),
    "log-json": ("true", lambda c: c.log_json, True),
    "slice-resync-seconds": ("0", lambda c: c.slice_resync_seconds, 0.0),
    "pod-uid": ("u-1", lambda c: c.pod_uid, "u-1"),
    "metrics-port": ("9400", lambda c: c.metrics_port, 9400),
    "latency-delay-bound-ms": ("0.5", lambda c: c.latency_delay_bound_seconds, 0.0005),
    "daemon-socket": ("/d.sock", lambda c: c.daemon_socket, Path("/d.sock")),
    "daemon-retry-seconds": ("5", lambda c: c.daemon_retry_seconds, 5.0),
    "control-link": ("fxctl0", lambda c: c.control_link, "fxctl0"),
    "control-link-cidr": ("169.254.1.1/24", lambda c: c.control_link_cidr, "169.254.1.1/24"),
    "control-link-kind": ("tap", lambda c: c.control_link_kind, "tap"),
    "residual-grace-seconds": ("7", lambda c: c.residual_grace_seconds, 7.0),
    "reconcile-period-seconds": ("9", lambda c: c.reconcile_period_seconds, 9.0),
    "rediscover-seconds": ("3", lambda c: c.rediscover_seconds, 3.0),
    "build-device-root": ("true", lambda c: c.build_device_root, True),
    "client-library": ("/opt/l/libascendcl.so", lambda c: c.client_library, Path("/opt/l/libascendcl.so")),
    "max-shares-per-die": ("7", lambda c: c.max_shares_per_die, 7),
    "placement": ("spread", lambda c: c.placement, Placement.SPREAD),
    "placement-writes-per-second": ("2", lambda c: c.placement_writes_per_second, 2.0),
    "host-memory-ratio": ("1.5", lambda c: c.host_memory.ratio, 1.5),
    "max-host-memory": ("8Gi", lambda c: c.host_memory.cap_bytes, 8 << 30),
    "otlp-endpoint": ("http://otel:4318", lambda c: c.otlp_endpoint, "http://otel:4318"),
}


@pytest.mark.parametrize("value", ["0", "-1", "2.5", "many"])
def test_max_shares_per_die_must_be_a_whole_number_of_at_least_one(value: str) -> None:
    with pytest.raises(InvalidInput) as info:
        from_args(["--node-name", "n", "--max-shares-per-die", value], {})
    assert info.value.field == "max-shares-per-die"


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_latency_delay_bound_must_be_a_positive_number(value: str) -> None:
    with pytest.raises(InvalidInput) as info:
        from_args(["--node-name", "n", "--latency-delay-bound-ms", value], {})
    assert info.value.field == "latency-delay-bound-ms"


def test_max_shares_per_die_defaults_to_63() -> None:
    assert from_args(["--node-name", "n"], {}).max_shares_per_die == 63


def test_every_flag_is_covered() -> None:
    assert sorted(READ) == sorted(f.name for f in config.PLUGIN_FLAGS)


@pytest.mark.parametrize("flag", [pytest.param(f, id=f.name) for f in config.PLUGIN_FLAGS])
def test_environment_twin_reaches_config(flag: config.Flag) -> None:
    value, read, expected = READ[flag.name]
    env = {"FLEXNPU_NODE_NAME": "n1", flag.env: value}
    assert flag.env == "FLEXNPU_" + flag.name.upper().replace("-", "_")
    assert read(from_args([], env)) == expected


@pytest.mark.parametrize("flag", [pytest.param(f, id=f.name) for f in config.PLUGIN_FLAGS])
def test_flag_beats_environment(flag: config.Flag) -> None:
    value, read, expected = READ[flag.name]
    env = {"FLEXNPU_NODE_NAME": "n1", flag.env: "from-env-but-ignored"}
    assert read(from_args([f"--{flag.name}", value], env)) == expected


def test_defaults() -> None:
    cfg = from_args([], {"FLEXNPU_NODE_NAME": "n1"})
    assert cfg.dra_socket == Path("/var/lib/kubelet/plugins/npu.flexnpu.io/dra.sock")
    assert cfg.registration_socket == Path("/var/lib/kubelet/plugins_registry/npu.flexnpu.io-reg.sock")
    assert cfg.daemon_socket == Path("/var/run/flexnpu/daemon.sock")
    assert (cfg.default_mode, cfg.control_link, cfg.metrics_port) == ("both", "flexnpu0", -1)


def test_pod_uid_gives_unique_sockets_for_rolling_updates() -> None:
    cfg = from_args(["--pod-uid", "abc"], {"FLEXNPU_NODE_NAME": "n1"})
    assert cfg.dra_socket.name == "dra-abc.sock"
    assert cfg.registration_socket.name == "npu.flexnpu.io-abc-reg.sock"


@pytest.mark.parametrize(
    ("env", "field"),
    [
        pytest.param({}, "node-name", id="no-node-name"),
        pytest.param(
            {"FLEXNPU_NODE_NAME": "n", "FLEXNPU_DEFAULT_MODE": "half"}, "default-mode", id="bad-mode"
        ),
        pytest.param({"FLEXNPU_NODE_NAME": "n", "FLEXNPU_LOG_JSON": "maybe"}, "log-json", id="bad-bool"),
        pytest.param(
            {"FLEXNPU_NODE_NAME": "n", "FLEXNPU_PLACEMENT": "pack"}, "placement", id="bad-placement"
        ),
        pytest.param(
            {"FLEXNPU_NODE_NAME": "n", "FLEXNPU_PLACEMENT_WRITES_PER_SECOND": "-1"},
            "placement-writes-per-second",
            id="bad-write-rate",
        ),
        pytest.param(
            {"FLEXNPU_NODE_NAME": "n", "FLEXNPU_METRICS_PORT": "x"}, "metrics-port", id="bad-number"
        ),
        pytest.param(
            {"FLEXNPU_NODE_NAME": "n", "FLEXNPU_HOST_MEMORY_RATIO": "0.5"},
            "host-memory-ratio",
            id="ratio-below-1",
        ),
        pytest.param(
            {"FLEXNPU_NODE_NAME": "n", "FLEXNPU_HOST_MEMORY_RATIO": "x"},
            "host-memory-ratio",
            id="ratio-not-a-number",
        ),
        pytest.param(
            {"FLEXNPU_NODE_NAME": "n", "FLEXNPU_MAX_HOST_MEMORY": "2Ti"}, "max-host-memory", id="cap-over-1Ti"
        ),
        pytest.param(
            {"FLEXNPU_NODE_NAME": "n", "FLEXNPU_MAX_HOST_MEMORY": "lots"},
            "max-host-memory",
            id="cap-not-a-quantity",
        ),
    ],
)
def test_bad_values_name_the_flag(env: dict[str, str], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        from_args([], env)
    assert (info.value.code, info.value.field) == (ErrorCode.INVALID_CONFIG, field)


def test_placement_defaults_to_binpack() -> None:
    cfg = from_args(["--node-name", "n"], {})
    assert (cfg.placement, cfg.placement_writes_per_second) == (Placement.BINPACK, 4.0)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        pytest.param({"placement": "fill"}, "placement", id="bad-placement"),
        pytest.param({"extender_port": "70000"}, "extender-port", id="bad-port"),
        pytest.param({"tls_cert_file": "/c.pem"}, "tls-key-file", id="cert-without-key"),
    ],
)
def test_extender_bad_values_name_the_flag(values: dict[str, str], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        config.build_extender(values)
    assert info.value.field == field


def test_extender_defaults() -> None:
    cfg = config.build_extender(
        config.resolve(config.from_args_namespace(config.EXTENDER_FLAGS), {}, config.EXTENDER_FLAGS)
    )
    assert (cfg.placement, cfg.port, cfg.tls_cert) == (Placement.BINPACK, 8444, None)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        pytest.param("", "", id="empty-is-off"),
        pytest.param("   ", "", id="blank-is-off"),
        pytest.param("http://otel-collector:4318", "http://otel-collector:4318", id="base-url"),
        pytest.param(
            " https://otel.example:443/v1/traces ", "https://otel.example:443/v1/traces", id="full-url"
        ),
        pytest.param("http://[::1]:4318", "http://[::1]:4318", id="ipv6"),
    ],
)
def test_otlp_endpoint_good_values(value: str, want: str) -> None:
    for flags, build in ((config.PLUGIN_FLAGS, config.build), (config.EXTENDER_FLAGS, config.build_extender)):
        values = config.resolve(config.from_args_namespace(flags), {"FLEXNPU_OTLP_ENDPOINT": value}, flags)
        if flags is config.PLUGIN_FLAGS:
            values["node_name"] = "n"
        assert build(values).otlp_endpoint == want


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("otel-collector:4318", id="no-scheme"),
        pytest.param("grpc://otel:4317", id="other-scheme"),
        pytest.param("http://", id="no-host"),
        pytest.param("http://otel:99999", id="port-too-large"),
        pytest.param("http://otel:port", id="port-not-a-number"),
        pytest.param("http://otel:4318/v1/traces extra", id="space-inside"),
        pytest.param("http://otel:4318/\x00", id="control-char"),
        pytest.param("collector", id="a-word"),
    ],
)
def test_otlp_endpoint_bad_values_name_the_flag(value: str) -> None:
    with pytest.raises(InvalidInput) as info:
        from_args(["--node-name", "n", "--otlp-endpoint", value], {})
    assert (info.value.code, info.value.field) == (ErrorCode.INVALID_CONFIG, "otlp-endpoint")
    assert repr(value.strip()) in str(info.value)
    with pytest.raises(InvalidInput) as info:
        config.build_extender({"otlp_endpoint": value})
    assert info.value.field == "otlp-endpoint"


def test_otlp_endpoint_standard_variable_is_read_after_the_flexnpu_twin() -> None:
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://std:4318"}
    assert from_args(["--node-name", "n"], otel).otlp_endpoint == "http://std:4318"
    both = {**otel, "FLEXNPU_OTLP_ENDPOINT": "http://flex:4318"}
    assert from_args(["--node-name", "n"], both).otlp_endpoint == "http://flex:4318"
    off = {**otel, "FLEXNPU_OTLP_ENDPOINT": ""}  # the FLEXNPU twin set to '' turns export off
    assert from_args(["--node-name", "n"], off).otlp_endpoint == ""
    flag = ["--node-name", "n", "--otlp-endpoint", "http://cli:4318"]
    assert from_args(flag, both).otlp_endpoint == "http://cli:4318"
