"""The NPU driver on the kubelet-plugin helper (``dra_kubeletplugin``), file by file like dra-example-driver's plugin.

``driver.py`` (``driver.go``: the driver the helper calls), ``prepare.py`` (``state.go``: the only
place that sequences effects) with ``effects.py``, ``hardsplit.py`` and ``adopt.py``, ``health.py``
(``health.go``), ``error_status.py`` (this driver's error codes as gRPC statuses), ``node.py`` (the node
process's wiring), ``cli.py`` (``main.go``: ``flexnpu-dra``) and ``smi.py`` (``flexnpu-smi``; its table: ``smi_tables.py``).
CDI specs and the checkpoint are ``dra_driver/cdi.py`` and ``dra_driver/checkpoint/``.
"""
