"""The aclserver launch spec and ready file on disk: the format of ``client/flexnpu_wire/launch.py``.

The format (types, parse, render) is defined once in the wire package. This module adds the
file effects both ends use: ``load_spec`` (the aclserver), ``write_ready`` (the aclserver, via
the atomic writer of ``dra_driver/files.py``) and ``load_ready`` (the daemon), and translates
``ContractError`` into ``InvalidInput`` naming the file, claim and field.
"""

from __future__ import annotations

import os
from pathlib import Path

from dra_driver import files
from dra_driver.errors import ErrorCode, InvalidInput
from flexnpu_wire import launch as _wire
from flexnpu_wire.errors import ContractError
from flexnpu_wire.launch import (
    BACKENDS,
    DEFAULT_AUTH_TIMEOUT_MS,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_SHARES_PER_DIE,
    DEFAULT_STAGING_BYTES,
    MAX_UNIX_PATH,
    MIN_FRAME_BYTES,
    SPEC_VERSION,
    AclServerSpec,
    ReadyInfo,
    ShareSpec,
    render_ready,
    render_spec,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_AUTH_TIMEOUT_MS",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_MAX_SHARES_PER_DIE",
    "DEFAULT_STAGING_BYTES",
    "MAX_UNIX_PATH",
    "MIN_FRAME_BYTES",
    "SPEC_VERSION",
    "AclServerSpec",
    "ReadyInfo",
    "ShareSpec",
    "load_ready",
    "load_spec",
    "parse_ready",
    "parse_spec",
    "render_ready",
    "render_spec",
    "write_ready",
    "write_spec",
]

_MAX_READ = 1 << 20


def parse_spec(text: str, *, source: str) -> AclServerSpec:
    """Parse and validate a spec document (InvalidInput naming ``source``, the claim and the field)."""
    try:
        return _wire.parse_spec(text, source=source)
    except ContractError as exc:
        raise _invalid(exc) from exc


def parse_ready(text: str, *, source: str) -> ReadyInfo:
    try:
        return _wire.parse_ready(text, source=source)
    except ContractError as exc:
        raise _invalid(exc) from exc


def load_spec(path: str | os.PathLike[str]) -> AclServerSpec:
    """Read and parse a spec file (InvalidInput naming the file if it is missing or malformed)."""
    try:
        text = files.read_nofollow(Path(path), max_bytes=_MAX_READ).decode()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise InvalidInput(
            f"cannot read aclserver spec {path}: {why}", code=ErrorCode.INVALID_CONFIG
        ) from exc
    return parse_spec(text, source=str(path))


def write_spec(path: str | os.PathLike[str], spec: AclServerSpec) -> None:
    """Write a launch spec (mode 0600: it holds the claim's token). Not fsynced: the run dir is
    volatile by design and a spec is rewritten at every start."""
    files.write_atomic(Path(path), render_spec(spec).encode(), mode=0o600, sync=False, dir_mode=0o700)


def write_ready(path: str | os.PathLike[str], info: ReadyInfo) -> None:
    """Write the ready file atomically (mode 0644: it holds no secret)."""
    files.write_atomic(Path(path), render_ready(info).encode(), mode=0o644, sync=False)


def load_ready(path: str | os.PathLike[str]) -> ReadyInfo:
    """Read a ready file (OSError propagates: the caller polls for it; InvalidInput if malformed)."""
    return parse_ready(files.read_nofollow(Path(path), max_bytes=_MAX_READ).decode(), source=str(path))


def _invalid(exc: ContractError) -> InvalidInput:
    return InvalidInput(exc.message, code=ErrorCode.INVALID_CONFIG, claim_uid=exc.claim_uid, field=exc.field)
