"""The API boundary: every client-library exception becomes a driver error, chained."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from controller import kube
from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput, Unavailable
from dra_kubeletplugin import errors as api_errors
from dra_kubeletplugin import kubeapi
from dra_kubeletplugin import (
    serialize as _serialize,  # its TurnMissed is a helper ApiError: the same set alone and in the suite
)


def translate(exc: BaseException, *, what: str) -> Exception:
    """The driver error for one client-library exception: the helper's translation, mapped once."""
    err = kubeapi.translate(exc, what=what)
    return kube.driver_error(err) if isinstance(err, api_errors.ApiError) else err


@contextlib.contextmanager
def boundary(what: str) -> Iterator[None]:
    """Any client exception raised inside, as the driver error (what every ``Kube`` call does)."""
    with kube.mapped(), kubeapi.boundary(what):
        yield


REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed"}
REASONS |= {409: "Conflict", 410: "Expired", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError"}
REASONS |= {503: "ServiceUnavailable"}


def _api(status: int, message: str = "boom", *, body: str | None = None) -> ApiException:
    """An ApiException as the client raises it: a real Status body unless ``body`` is given."""
    exc = ApiException(status=status, reason="Reason")
    status_body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
    status_body |= {"reason": REASONS.get(status, ""), "code": status}
    exc.body = json.dumps(status_body) if body is None else body
    return exc


@pytest.mark.parametrize(
    ("exc", "cls", "parent", "code"),
    [
        pytest.param(_api(400), kube.Rejected, InvalidInput, ErrorCode.INVALID_ARGUMENT, id="400"),
        pytest.param(_api(401), kube.Forbidden, Unavailable, ErrorCode.API_UNAVAILABLE, id="401"),
        pytest.param(_api(403), kube.Forbidden, Unavailable, ErrorCode.API_UNAVAILABLE, id="403"),
        pytest.param(_api(404), kube.NotFound, InvalidInput, ErrorCode.INVALID_ARGUMENT, id="404"),
        pytest.param(
            _api(404, body="404 page not found\n"),
            kube.Ambiguous,
            Unavailable,
            ErrorCode.API_UNAVAILABLE,
            id="404-not-a-status",
        ),
        pytest.param(
            _api(404, body='{"kind": "Status", "apiVersion": "v1", "code": 404}'),
            kube.Ambiguous,
            Unavailable,
            ErrorCode.API_UNAVAILABLE,
            id="404-status-without-reason",
        ),
        pytest.param(
            _api(404, body="{}"),
            kube.Ambiguous,
            Unavailable,
            ErrorCode.API_UNAVAILABLE,
            id="404-empty-object",
        ),
        pytest.param(_api(405), kube.Rejected, InvalidInput, ErrorCode.INVALID_ARGUMENT, id="405"),
        pytest.param(_api(409), kube.Conflict, Unavailable, ErrorCode.API_CONFLICT, id="409"),
        pytest.param(_api(410), kube.Gone, Unavailable, ErrorCode.API_UNAVAILABLE, id="410"),
        pytest.param(_api(422), kube.Rejected, InvalidInput, ErrorCode.INVALID_ARGUMENT, id="422"),
        pytest.param(_api(429), kube.ServerError, Unavailable, ErrorCode.API_UNAVAILABLE, id="429"),
        pytest.param(_api(500), kube.ServerError, Unavailable, ErrorCode.API_UNAVAILABLE, id="500"),
        pytest.param(_api(503), kube.Unreachable, Unavailable, ErrorCode.API_UNAVAILABLE, id="503"),
        pytest.param(
            ApiException(status=0, reason="SSLError"),
            kube.Unreachable,
            Unavailable,
            ErrorCode.API_UNAVAILABLE,
            id="ssl",
        ),
        pytest.param(
            urllib3.exceptions.MaxRetryError(None, "/x", reason=ConnectionRefusedError()),  # type: ignore[arg-type]
            kube.Unreachable,
            Unavailable,
            ErrorCode.API_UNAVAILABLE,
            id="connection-refused",
        ),
        pytest.param(
            urllib3.exceptions.ReadTimeoutError(None, "/x", "timed out"),  # type: ignore[arg-type]
            kube.Unreachable,
            Unavailable,
            ErrorCode.API_UNAVAILABLE,
            id="read-timeout",
        ),
        pytest.param(
            urllib3.exceptions.ProtocolError("reset"),
            kube.Unreachable,
            Unavailable,
            ErrorCode.API_UNAVAILABLE,
            id="protocol",
        ),
        pytest.param(
            ConnectionResetError("reset"),
            kube.Unreachable,
            Unavailable,
            ErrorCode.API_UNAVAILABLE,
            id="os-error",
        ),
        pytest.param(
            ValueError("bad json"), kube.Ambiguous, Unavailable, ErrorCode.API_UNAVAILABLE, id="bad-json"
        ),
        pytest.param(
            ConfigException("no file"),
            kube.BadKubeconfig,
            InvalidInput,
            ErrorCode.INVALID_CONFIG,
            id="kubeconfig",
        ),
    ],
)
def test_translation_table(
    exc: Exception, cls: type[FlexNPUError], parent: type[FlexNPUError], code: ErrorCode
) -> None:
    with pytest.raises(FlexNPUError) as info, boundary("get thing"):
        raise exc
    err = info.value
    assert type(err) is cls
    assert isinstance(err, parent)
    assert err.code == code
    assert err.__cause__ is exc
    assert "get thing" in str(err)
    assert not isinstance(err, api_errors.PluginError)  # one vocabulary: the driver's only, mapped once
    helper_err = kubeapi.translate(exc, what="get thing")  # the helper's own class for the same failure
    assert isinstance(helper_err, api_errors.ApiError)
    assert str(helper_err) in str(err)
    assert api_errors.retryable(err) == isinstance(err, Unavailable)


assert _serialize.TurnMissed


def _helper_api_errors(cls: type[api_errors.ApiError]) -> list[type[api_errors.ApiError]]:
    return [sub for direct in cls.__subclasses__() for sub in (direct, *_helper_api_errors(direct))]


@pytest.mark.parametrize("helper_cls", _helper_api_errors(api_errors.ApiError), ids=lambda c: c.__name__)
def test_every_helper_api_error_has_its_driver_class(helper_cls: type[api_errors.ApiError]) -> None:
    err = kube.driver_error(helper_cls("get thing: HTTP 4xx"))
    nearest = next(c for c in helper_cls.__mro__ if c in kube.DRIVER_ERRORS)  # the table's nearest class wins
    assert type(err) is kube.DRIVER_ERRORS[nearest]
    assert err.message == "get thing: HTTP 4xx"
    assert api_errors.retryable(err) == api_errors.retryable(helper_cls("x"))


def test_the_helper_view_raises_the_helpers_errors_and_kube_the_drivers() -> None:
    driver_side = kube.Kube.offline()
    helper_side = driver_side.for_helper()
    with pytest.raises(kube.Unreachable) as driver_info:
        driver_side.get_node("n1")
    with pytest.raises(api_errors.Unreachable) as helper_info:
        helper_side.get_node("n1")
    assert not isinstance(helper_info.value, FlexNPUError)
    assert not isinstance(driver_info.value, api_errors.PluginError)
    assert helper_side.api_client is driver_side.api_client  # one connection


def test_status_message_is_kept() -> None:
    err = translate(_api(422, "spec.devices[0].name: Invalid value"), what="create resourceslice")
    assert "spec.devices[0].name: Invalid value" in str(err)
    assert "HTTP 422" in str(err)


def test_driver_errors_pass_through_unchanged() -> None:
    original = kube.Gone("already translated")
    with pytest.raises(kube.Gone) as info, boundary("watch"):
        raise original
    assert info.value is original


def test_unreachable_server_is_unavailable() -> None:
    """A real request to a closed port goes through the whole client stack and is translated."""
    import socket

    from kubernetes import client

    with socket.socket() as sock:  # reserve a port, then close it so nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
    configuration.retries = 0
    k = kube.Kube(client.ApiClient(configuration), request_timeout=2)
    try:
        with pytest.raises(Unavailable, match="unreachable"):
            k.get_node("node-1")
    finally:
        k.close()


def test_kubeconfig_missing_file_is_invalid_config(tmp_path: object) -> None:
    with pytest.raises(InvalidInput) as info:
        kube.Kube.from_config(str(tmp_path) + "/does-not-exist")
    assert info.value.field == "kubeconfig"


def test_no_error_class_is_both_a_driver_error_and_a_helper_error() -> None:
    """Issue 28: one vocabulary per side (no ``class NotFound(InvalidInput, api.NotFound)``), in every
    module of the node side and the runtime."""
    import importlib
    import inspect
    import pkgutil

    both: list[str] = []
    seen: set[type] = set()
    for name in ("dra_driver", "dra_kubeletplugin", "kubeletplugin", "controller", "flexnpu_runtime"):
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            if ".gen" in info.name or info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, FlexNPUError):
                    seen.add(cls)
                    if issubclass(cls, api_errors.PluginError):
                        both.append(f"{cls.__module__}.{cls.__qualname__}")
    assert len(seen) >= 10  # the walk reached the driver's error classes (16 today)
    assert sorted(set(both)) == []
