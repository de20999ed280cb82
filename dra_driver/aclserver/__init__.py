"""The aclserver: one process per prepared soft-split claim that executes ACL calls for its container.

Modules: ``spec`` (the launch spec the daemon writes), ``codes`` (ACL error codes and enums),
``protocol`` (the wire framing shared with the client), ``datalink`` (shared-memory buffers),
``scheduling`` (pure compute-quota decisions), ``ledger`` (the per-die shared ledger),
``backend`` (the device behind a ``Backend`` protocol; ``emulated`` here), ``session`` (one
client connection's ACL state), ``server`` (sockets, authentication) and ``main`` (entry point).
Nothing here imports grpc, kubernetes or numpy: the process must start fast and stay small.
"""
