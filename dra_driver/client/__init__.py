"""FlexNPU client library: forwards ACL calls from the container to the claim's aclserver.

Two faces over one ``Session``: the object API (``Session.open()``) and the pyACL-shaped module
``dra_driver.client.acl`` (``acl.init()``, ``acl.rt.malloc(...)`` returning ``(value, ret)``).
Modules: ``transport`` (sockets), ``session`` (calls and the data link), ``acl``/``rt``
(pyACL shape), ``errors``, ``probe`` (CLI). numpy is accepted for host buffers but not imported.
"""

from __future__ import annotations

from dra_driver.aclserver.codes import MallocPolicy, MemAttr, MemcpyKind, Policy
from dra_driver.client.errors import AclError, ClientError, ConnectError
from dra_driver.client.session import Session

__all__ = [
    "AclError",
    "ClientError",
    "ConnectError",
    "MallocPolicy",
    "MemAttr",
    "MemcpyKind",
    "Policy",
    "Session",
]
