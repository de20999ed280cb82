"""Whole-call failures as gRPC status codes: the helper's table for its own errors, the driver's for the rest.

A whole-call failure becomes a gRPC error; per-claim failures never do, they travel in the claim's
``error`` field. One table per vocabulary, no table falling back to another (:func:`mapped`): the
helper's own exceptions (:mod:`dra_kubeletplugin.errors`) by :func:`status_for`, every other
exception by the driver's table (``error_status`` handed to ``start()``; this same
:func:`status_for` if the driver has none). Anything unknown is a bug and maps to ``INTERNAL`` with
a message that says so (:func:`internal`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NoReturn

import grpc

from dra_kubeletplugin import errors

__all__ = ["ErrorStatus", "abort_with", "internal", "mapped", "status_for"]

ErrorStatus = Callable[[BaseException], tuple[grpc.StatusCode, str]]
"""A driver's table: the status code and detail text for an exception that failed a whole call."""

_BY_CLASS: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.Conflict, grpc.StatusCode.ABORTED),
    (errors.ApiUnavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.DroppedFieldsError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.Rejected, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.ClaimRejected, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.PluginError, grpc.StatusCode.INTERNAL),
)


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status code and detail text for an exception that failed a whole call."""
    for cls, code in _BY_CLASS:
        if isinstance(exc, cls):
            return code, str(exc)
    return internal(exc)


def internal(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """A bug: ``INTERNAL``, saying so."""
    return grpc.StatusCode.INTERNAL, f"internal error in the driver: {type(exc).__name__}: {exc}"


def mapped(exc: BaseException, table: ErrorStatus) -> tuple[grpc.StatusCode, str]:
    """The status of a failed call: the helper's errors by its own table, the rest by ``table``."""
    return status_for(exc) if isinstance(exc, errors.PluginError) else table(exc)


def abort_with(
    context: grpc.ServicerContext,
    exc: BaseException,
    *,
    what: str,
    log: logging.Logger | logging.LoggerAdapter[logging.Logger],
    table: ErrorStatus = status_for,
) -> NoReturn:
    """Log ``exc`` and end the RPC with its mapped status. Never returns."""
    code, detail = mapped(exc, table)
    log.error("%s failed: %s", what, detail, exc_info=code == grpc.StatusCode.INTERNAL)
    context.abort(code, f"{what}: {detail}")
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover
