"""The gRPC face to the kubelet: registration, DRA v1/v1beta1, health streaming, the server.

Modules here decode protobuf, call the domain (``dra_driver``), encode the answer and map
errors to gRPC status codes. They hold no claim state; ``prepare.py`` sequences effects.
"""
