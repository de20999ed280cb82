"""Old import path (documented alias): ``client.conf`` is ``flexnpu_wire.clientconf``; driver-error reads are ``dra_driver.wirefiles``.

``parse``/``load`` here raise :class:`~dra_driver.errors.InvalidInput` as they always did (they are
``wirefiles.parse_client_conf``/``load_client_conf``). No production module imports this path
(``tests/unit/test_import_graph.py``).
"""

from __future__ import annotations

from dra_driver.wirefiles import invalid_input
from dra_driver.wirefiles import load_client_conf as load
from dra_driver.wirefiles import parse_client_conf as parse
from flexnpu_wire.clientconf import (
    CONF_VERSION,
    DEFAULT_PATH,
    ENV_VAR,
    ClientConf,
    Endpoints,
    ShareInfo,
    render,
)

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
