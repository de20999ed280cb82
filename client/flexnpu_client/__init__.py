"""FlexNPU client library: forwards ACL calls from the container to the claim's aclserver.

Its own distribution (``flexnpu-client``, folder ``client/``) with no dependency beyond the
standard library and the wire contracts (``flexnpu_wire``), so application images install it
alone. Two faces over one ``Session``: the object API (``Session.open()``) and the pyACL-shaped
module ``flexnpu_client.acl`` (``acl.init()``, ``acl.rt.malloc(...)`` returning
``(value, ret)``).
Modules: ``transport`` (sockets), ``session`` (calls and the data link), ``acl``/``rt``
(pyACL shape), ``errors``, ``probe`` (CLI). numpy is accepted for host buffers but not imported.

Several processes (and threads) may hold sessions on one claim at once, up to the aclserver's
``max_sessions`` (16 by default); they share the claim's memory and compute quota.
"""

from __future__ import annotations

from flexnpu_client.errors import AclError, ClientError, ConfigError, ConnectError
from flexnpu_client.session import Session
from flexnpu_wire.codes import MallocPolicy, MemAttr, MemcpyKind, Policy

__all__ = [
    "AclError",
    "ClientError",
    "ConfigError",
    "ConnectError",
    "MallocPolicy",
    "MemAttr",
    "MemcpyKind",
    "Policy",
    "Session",
]
