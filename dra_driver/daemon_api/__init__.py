"""The node ↔ daemon contract, both ends' half: value types, their protobuf conversions, the node's client.

* ``values.py`` — the types both ends exchange (registration, endpoints, entities, health) and the
  shm root's layout; imported by the domain core and the kubelet plugin.
* ``wire.py`` — conversions between those and ``api_protos/proto/flexnpu_daemon.proto``.
* ``client.py`` — :class:`~dra_driver.daemon_api.client.DaemonClient`, the node's (and
  ``flexnpu-smi``'s) end of the API.

The daemon itself (``flexnpu_runtime/daemon/``, the runtime) serves the API in ``service.py``; nothing
here imports it.
"""
