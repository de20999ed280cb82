"""FlexNPU DRA driver: the domain core shared by the kubelet plugin, controllers, daemon and tools."""

DEFAULT_DRIVER_NAME = "npu.flexnpu.io"
