"""The daemon's error → gRPC status table, its inverse in the client, and flag/env precedence."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from dra_driver.daemon_api import client
from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput, StateError, Unavailable
from flexnpu_runtime.daemon import main, service


@pytest.mark.parametrize(
    ("error", "status"),
    [
        pytest.param(InvalidInput("x"), grpc.StatusCode.INVALID_ARGUMENT, id="invalid-input"),
        pytest.param(StateError("x"), grpc.StatusCode.FAILED_PRECONDITION, id="state-error"),
        pytest.param(Unavailable("x"), grpc.StatusCode.UNAVAILABLE, id="unavailable"),
        pytest.param(FlexNPUError("x"), grpc.StatusCode.INTERNAL, id="base"),
    ],
)
def test_status_table(error: FlexNPUError, status: grpc.StatusCode) -> None:
    assert service.status_for(error) == status


def test_every_error_class_round_trips_through_the_client_table() -> None:
    for cls, status in service.STATUS_BY_ERROR:
        back = client.ERROR_BY_STATUS.get(status, (FlexNPUError, ErrorCode.INTERNAL))[0]
        assert back is cls, (cls, status)
    assert FlexNPUError.__subclasses__() == [InvalidInput, Unavailable, StateError]  # table complete


class _FakeRpcError(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    def __init__(self, code: grpc.StatusCode, details: str, md: tuple[tuple[str, object], ...]) -> None:
        self._code, self._details, self._md = code, details, md

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, object], ...]:
        return self._md

    def initial_metadata(self) -> tuple[()]:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: object) -> bool:
        return False


def test_client_rebuilds_the_daemon_error() -> None:
    md = (
        ("flexnpu-error-code", "PolicyConflict"),
        ("flexnpu-claim-uid", "uid-1"),
        ("flexnpu-field", "shares[0].policy"),
        ("flexnpu-message-bin", b"die 2 already runs policy 'fixed'"),
    )
    err = client.error_from_rpc(
        _FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "full text", md), socket_path="/s", claim_uid=None
    )
    assert isinstance(err, StateError)
    assert (err.code, err.claim_uid, err.field) == (ErrorCode.POLICY_CONFLICT, "uid-1", "shares[0].policy")
    assert (
        str(err) == "claim uid-1, field shares[0].policy: die 2 already runs policy 'fixed' [PolicyConflict]"
    )


def test_transport_failure_is_daemon_unavailable() -> None:
    err = client.error_from_rpc(
        _FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connect failed", ()), socket_path="/s.sock", claim_uid="u"
    )
    assert isinstance(err, Unavailable) and err.code is ErrorCode.DAEMON_UNAVAILABLE
    assert "/s.sock" in str(err) and err.claim_uid == "u"


@pytest.mark.parametrize(
    ("argv", "env", "expect"),
    [
        pytest.param(
            [], {}, ("/var/run/flexnpu/daemon.sock", "/dev/shm/flexnpu", "127.0.0.1", True), id="defaults"
        ),
        pytest.param(
            [],
            {"FLEXNPU_DAEMON_SOCKET": "/tmp/e.sock", "FLEXNPU_DAEMON_SHM_ROOT": "/dev/shm/e"},
            ("/tmp/e.sock", "/dev/shm/e", "127.0.0.1", True),
            id="env-twins",
        ),
        pytest.param(
            ["--socket", "/tmp/f.sock", "--tcp-host", "10.0.0.1", "--launcher", "spawn"],
            {"FLEXNPU_DAEMON_SOCKET": "/tmp/e.sock"},
            ("/tmp/f.sock", "/dev/shm/flexnpu", "10.0.0.1", False),
            id="flag-beats-env",
        ),
        pytest.param(
            ["--aclserver-command", "/bin/true"],
            {},
            ("/var/run/flexnpu/daemon.sock", "/dev/shm/flexnpu", "127.0.0.1", False),
            id="custom-command-is-spawned",
        ),
    ],
)
def test_flags(argv: list[str], env: dict[str, str], expect: tuple[str, str, str, bool]) -> None:
    cfg = main.build_config(argv, env)
    assert (str(cfg.socket), str(cfg.settings.shm_root), cfg.settings.tcp_host, cfg.use_zygote) == expect
    assert cfg.settings.registry_file == Path("/var/lib/flexnpu/daemon/registry.json")


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        pytest.param(["--launcher", "thread"], "launcher", id="bad-launcher"),
        pytest.param(["--ready-timeout", "soon"], "ready-timeout", id="bad-number"),
        pytest.param(["--max-restarts", "-1"], "max-restarts", id="negative"),
    ],
)
def test_bad_flags(argv: list[str], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        main.build_config(argv, {})
    assert info.value.field == field and info.value.code is ErrorCode.INVALID_CONFIG
