"""The kubelet's gRPC APIs as ``.proto`` sources (``proto/``) and their generated Python (``gen/``).

DRA v1 and v1beta1, plugin registration v1, DRA health v1alpha1 and v1, copied from the kubelet's
``pkg/apis``. Regenerate with ``python -m api_protos.generate``; never edit ``gen/`` by hand (a test
fails when it differs from a fresh generation).
"""
