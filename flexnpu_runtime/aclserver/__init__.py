"""The aclserver: one process per prepared soft-split claim that executes ACL calls for its container.

Modules (the wire — launch spec, codes, framing — is ``flexnpu_wire``): ``datalink``
(shared-memory buffers), ``scheduling`` (pure compute-quota decisions), ``ledger`` (the per-die
shared ledger), ``backend`` (the ``Backend`` protocol and the values both sides share;
``backend_emulated``, ``backend_ascend`` with ``ascend_models``, ``ascend_vmm``, ``ascend_ops`` and its
paths ``ascend_aclop``/``ascend_aclnn``, over ``ascend_ctypes``), ``quota`` (the quota book both
backends build: shares, allocations, die time), ``hostmem`` (the claim's host-memory budget),
``claim`` (what a claim's sessions share), ``dispatch`` (one connection's ACL session and its op table),
``memory`` (device memory, host buffers, copies), ``streams`` (streams, kernels and the task
queue), ``models`` (models: bytes in flight, load, desc, execution, unload), ``model_exec`` (the
emulated model compute), ``server`` (sockets, authentication) and ``main`` (entry point).
Nothing here imports grpc or kubernetes, and numpy only when a model first executes: the process
must start fast and stay small.
"""
