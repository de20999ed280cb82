"""Controllers that talk to the Kubernetes API: residual cleanup and claim status (slices: the helper's).

Each compares a pure desired state from ``dra_driver`` with what the API holds and writes only
the difference. The driver's API calls and their error classes live in :mod:`controller.kube`,
built on the kubelet-plugin helper's REST client; ResourceSlice publishing is the helper's
``dra_kubeletplugin/resourceslice/``.
"""
