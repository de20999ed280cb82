"""The FlexNPU host daemon: owns one aclserver process group per registered claim.

Layers, top down (each module's docstring says what it owns):

- ``main``           flags (``FLEXNPU_DAEMON_…`` twins), wiring, signals.
- ``instance``       the lock one daemon instance holds for life (a second one waits).
- ``service``        the gRPC face (``flexnpu.daemon.v1.FlexNPUDaemon``) and the error → status table.
- ``manager``        the API: register, unregister, list, health, composed from:
- ``entities``       the registered claims in memory, their locks, the one registry writer;
- ``aclservers``     starting, restarting, stopping one claim's aclserver (files, cgroup, process);
- ``recovery``       re-adoption and clean-up at start (files, stale cgroups; live ones kept on doubt);
- ``ownership``      the install identity on each claim cgroup: what is provably this daemon's;
- ``supervision``    the pidfd monitor, exit reasons (OOM kills), restarts within the budget.
- ``cgroups``        each aclserver's own cgroup on the host; ``cgroup_layout`` (pure): the
                     hierarchies and the files; ``bounds`` (pure): memory, tasks, CPU weight.
- ``registry``       the on-disk registry (versioned, checksummed, atomic).
- ``launcher``       starting aclservers into their cgroup: forked from the ``zygote``, or spawned.
- ``processes``      /proc identity, readiness, stopping process groups, finding orphans.
- ``aclserver_ping`` PING an aclserver (peer credentials, one deadline, off the API workers); ``usage``: memory in use from the die ledgers.
- ``claim_files``    a claim's shm dir, spec, ready and stderr files (stderr is retired, not deleted);
                     ``shmfs``: its size-limited tmpfs; ``shmroot``: whether the shm root reaches the
                     containers.
- ``registration_rules`` pure rules a registration must satisfy.
- ``launch_spec``    pure: per-claim paths and the aclserver launch spec.
- ``settings``       the one settings value every part reads.
- ``model``          the daemon's own registry record (the values node and daemon share, their proto
                     conversions and :class:`DaemonClient` are in ``dra_driver/daemon_api/``).
- ``zygote``         the pre-imported fork server (a separate process; never imports grpc);
                     ``zygote_marker``: how its children are recognised.
"""
