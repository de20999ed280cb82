"""This driver's own wire contract, the daemon API, as ``.proto`` source (``proto/``) and generated Python (``gen/``).

The kubelet's APIs live with the kubelet-plugin helper (``dra_kubeletplugin/protos/``).
Regenerate both with ``python -m api_protos.generate``; never edit a ``gen/`` by hand.
"""
