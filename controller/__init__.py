"""Controllers that talk to the Kubernetes API: slice publisher, cleanup, claim status, taints.

Each compares a pure desired state from ``dra_driver`` with what the API holds and writes only
the difference. All API calls and their error mapping live in :mod:`controller.kube`.
"""
