"""The aclserver: one process per prepared soft-split claim that executes ACL calls for its container.

Modules: ``spec`` (the launch spec the daemon writes), ``codes`` (ACL error codes and enums),
``protocol`` (the wire framing shared with the client), ``datalink`` (shared-memory buffers),
``scheduling`` (pure compute-quota decisions), ``ledger`` (the per-die shared ledger),
``quota`` (the quota book both backends share: shares, allocations, die time), ``backend`` (the
``Backend`` protocol; ``backend_emulated``, ``backend_ascend`` with ``ascend_models``), ``claim``
(what a claim's sessions share), ``dispatch`` (one connection's ACL session and its op table),
``memory`` (device memory, host buffers, copies), ``streams`` (streams, kernels and the task
queue), ``models`` (models: bytes in flight, load, desc, execution, unload), ``model_exec`` (the
emulated model compute), ``server`` (sockets, authentication) and ``main`` (entry point).
Nothing here imports grpc or kubernetes, and numpy only when a model first executes: the process
must start fast and stay small.
"""
