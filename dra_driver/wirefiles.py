"""The wire package's documents as files, with driver errors: the aclserver launch spec, its ready file, client.conf.

The formats (types, parse, render) are ``client/flexnpu_wire/launch.py`` and ``clientconf.py``,
defined once and shared with the container's client. This module owns what the driver does with
them on disk — one call per effect, for both ends of the daemon ↔ aclserver boundary:

* :func:`write_spec` (the daemon; mode 0600: it holds the claim's token) and :func:`load_spec`
  (the aclserver);
* :func:`write_ready` (the aclserver; mode 0644) and :func:`read_ready` (the daemon, which polls:
  ``None`` while the file is absent or not yet a whole ready document);
* :func:`load_client_conf` (``flexnpu-smi adopt`` reads a claim's token back).

Writes go through the one atomic writer (``dra_driver/files.py``), reads refuse symlinks and
oversize files, and a broken document (``flexnpu_wire.errors.ContractError``) becomes
:class:`~dra_driver.errors.InvalidInput` (code ``InvalidConfig``) naming the file, claim and field
here, the driver's one boundary for that error.
"""

from __future__ import annotations

import os
from pathlib import Path

from dra_driver import files
from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput
from flexnpu_wire import clientconf, launch
from flexnpu_wire.clientconf import ClientConf
from flexnpu_wire.errors import ContractError
from flexnpu_wire.launch import AclServerSpec, ReadyInfo

__all__ = [
    "invalid_input",
    "load_client_conf",
    "load_ready",
    "load_spec",
    "parse_ready",
    "parse_spec",
    "read_ready",
    "write_ready",
    "write_spec",
]

MAX_READ = 1 << 20
"""Largest spec, ready file or client.conf read (they are a few hundred bytes)."""

PathLike = str | os.PathLike[str]


def invalid_input(exc: ContractError) -> InvalidInput:
    """The driver error for a broken wire document (code ``InvalidConfig``, the claim and field kept)."""
    return InvalidInput(exc.message, code=ErrorCode.INVALID_CONFIG, claim_uid=exc.claim_uid, field=exc.field)


# --- the launch spec and the ready file (daemon ↔ aclserver) --------------------------------


def write_spec(path: PathLike, spec: AclServerSpec) -> None:
    """Write a launch spec (mode 0600: it holds the claim's token). Not fsynced: the run dir is
    volatile by design and a spec is rewritten at every start."""
    files.write_atomic(Path(path), launch.render_spec(spec).encode(), mode=0o600, sync=False, dir_mode=0o700)


def load_spec(path: PathLike) -> AclServerSpec:
    """Read and parse a spec file (InvalidInput naming the file if it is missing or malformed)."""
    try:
        text = files.read_nofollow(Path(path), max_bytes=MAX_READ).decode()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise InvalidInput(
            f"cannot read aclserver spec {path}: {why}", code=ErrorCode.INVALID_CONFIG
        ) from exc
    return parse_spec(text, source=str(path))


def write_ready(path: PathLike, info: ReadyInfo) -> None:
    """Write the ready file atomically (mode 0644: it holds no secret)."""
    files.write_atomic(Path(path), launch.render_ready(info).encode(), mode=0o644, sync=False)


def read_ready(path: PathLike) -> ReadyInfo | None:
    """The aclserver's ready file, or None while it is absent or not readable as one (the daemon polls)."""
    try:
        return load_ready(path)
    except (OSError, UnicodeDecodeError, FlexNPUError):
        return None


def load_ready(path: PathLike) -> ReadyInfo:
    """Read a ready file (OSError propagates; InvalidInput if malformed)."""
    return parse_ready(files.read_nofollow(Path(path), max_bytes=MAX_READ).decode(), source=str(path))


def parse_spec(text: str, *, source: str) -> AclServerSpec:
    """Parse and validate a spec document (InvalidInput naming ``source``, the claim and the field)."""
    try:
        return launch.parse_spec(text, source=source)
    except ContractError as exc:
        raise invalid_input(exc) from exc


def parse_ready(text: str, *, source: str) -> ReadyInfo:
    try:
        return launch.parse_ready(text, source=source)
    except ContractError as exc:
        raise invalid_input(exc) from exc


# --- client.conf (node ↔ container) ------------------------------------------------------------


def load_client_conf(path: PathLike | None = None) -> ClientConf:
    """Load client.conf from ``path``, else ``$FLEXNPU_CONF``, else /etc/flexnpu/client.conf."""
    try:
        return clientconf.load(path)
    except ContractError as exc:
        raise invalid_input(exc) from exc
