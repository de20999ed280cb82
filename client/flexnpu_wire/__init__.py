"""FlexNPU wire contracts: every format both ends of a runtime boundary share, defined once.

Dependency-free (standard library only; a test proves it): the container client, the
aclserver, the daemon and the kubelet plugin import these modules, and a C client is generated
from or checked against the same tables (``python -m flexnpu_wire.emit``).

| module | contract | ends |
|---|---|---|
| ``ops`` | op numbers and argument layouts (a table: one row per op) | client ↔ aclserver |
| ``framing`` | the length-prefixed frame, encode/decode, a buffered reader | client ↔ aclserver |
| ``datalink`` | host pointer layout and region file names in the claim's shm dir | client ↔ aclserver |
| ``codes`` | ACL return codes, memcpy kinds, memory attributes, ``Policy`` | everyone |
| ``clientconf`` | ``client.conf`` (docs/client-conf.md) | kubelet plugin → container |
| ``launch`` | the aclserver launch spec and its ready file | daemon ↔ aclserver |
| ``shares`` | the share record (one vNPU: die, quotas, policy) | plugin → daemon → aclserver |
| ``errors`` | ``ContractError``, the one error these modules raise | |
"""

from __future__ import annotations
