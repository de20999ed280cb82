"""FlexNPU's host runtime: the processes that serve shares on a node, apart from the driver.

* ``flexnpu_runtime.daemon`` — ``flexnpu-daemon``, the resident FlexNPU daemon: owns the aclserver
  process groups, their cgroups and shm mounts, keeps a registry on disk, and rolls without taking
  them along. Its API (register / unregister / list / health) is gRPC on a unix socket; the contract
  both sides share is ``dra_driver.daemon_api``.
* ``flexnpu_runtime.aclserver`` — ``flexnpu-aclserver``, one process group per prepared share (or per
  claim): the host-side executor that enforces each share's memory and compute quota, serving the
  container's client over its own framing (``flexnpu_wire``).

The runtime imports the driver's core (errors, config values, files) and the wire package; the core,
the kubelet plugin and the controllers import no runtime module (``tests/unit/test_import_graph.py``).
"""
