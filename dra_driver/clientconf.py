"""``client.conf`` for the driver: the format of ``client/flexnpu_wire/clientconf.py``, driver errors.

The format (types, ``render``, ``parse``, ``load``) is defined once in the wire package; this
module re-exports it and translates its ``ContractError`` into ``InvalidInput`` (code
``InvalidConfig``, with the claim UID and field), the driver's one boundary for that error.
"""

from __future__ import annotations

import os

from dra_driver.errors import ErrorCode, InvalidInput
from flexnpu_wire import clientconf as _wire
from flexnpu_wire.clientconf import (
    CONF_VERSION,
    DEFAULT_PATH,
    ENV_VAR,
    ClientConf,
    Endpoints,
    ShareInfo,
    render,
)
from flexnpu_wire.errors import ContractError

__all__ = [
    "CONF_VERSION",
    "DEFAULT_PATH",
    "ENV_VAR",
    "ClientConf",
    "Endpoints",
    "ShareInfo",
    "invalid_input",
    "load",
    "parse",
    "render",
]


def parse(text: str, *, source: str) -> ClientConf:
    """Parse client.conf text (InvalidInput naming ``source``, the claim and the field)."""
    try:
        return _wire.parse(text, source=source)
    except ContractError as exc:
        raise invalid_input(exc) from exc


def load(path: str | os.PathLike[str] | None = None) -> ClientConf:
    """Load client.conf from ``path``, else ``$FLEXNPU_CONF``, else /etc/flexnpu/client.conf."""
    try:
        return _wire.load(path)
    except ContractError as exc:
        raise invalid_input(exc) from exc


def invalid_input(exc: ContractError) -> InvalidInput:
    """The driver error for a broken wire document."""
    return InvalidInput(exc.message, code=ErrorCode.INVALID_CONFIG, claim_uid=exc.claim_uid, field=exc.field)
