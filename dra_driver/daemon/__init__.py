"""The FlexNPU host daemon: owns one aclserver process group per registered claim.

Layers, top down (each module's docstring says what it owns):

- ``main``           flags (``FLEXNPU_DAEMON_…`` twins), wiring, signals.
- ``service``        the gRPC face (``flexnpu.daemon.v1.FlexNPUDaemon``) and the error → status table.
- ``manager``        the lifecycle: register, unregister, list, re-adopt at start, monitor/restart.
- ``registry``       the on-disk registry (versioned, checksummed, atomic).
- ``launcher``       starting aclservers: forked from the ``zygote`` process, or spawned.
- ``processes``      /proc identity, readiness, stopping process groups, finding orphans.
- ``liveness``       PING an aclserver; ``usage``: memory in use from the die ledgers.
- ``files``          atomic writes; a claim's shm dir, spec, ready and stderr files.
- ``validation``     pure rules a registration must satisfy.
- ``spec``           pure: per-claim paths and the aclserver launch spec.
- ``model``          pure data types shared by all of the above, the client and ``flexnpu-smi``.
- ``wire``           protobuf ↔ model conversion.
- ``client``         :class:`DaemonClient`, used by the kubelet plugin and ``flexnpu-smi``.
- ``zygote``         the pre-imported fork server (a separate process; never imports grpc).
"""
