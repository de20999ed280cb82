"""Old import path (documented alias): the launch spec format is ``flexnpu_wire.launch``; its files are ``dra_driver.wirefiles``.

No production module imports this path (``tests/unit/test_import_graph.py``).
"""

from __future__ import annotations

from dra_driver.wirefiles import load_ready, load_spec, parse_ready, parse_spec, write_ready, write_spec
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
