"""The emulated die's cost model: how long an op holds the die, from the bytes it moves and its flops.

    die_time_ns = max(FLOOR_NS, LAUNCH_NS + bytes / BYTES_PER_NS + flops / FLOPS_PER_NS)

``bytes`` is every input and output array's size (a host-resident input, such as a shape or a
scalar, counts too: it is small); ``flops`` is the kernel's own count (a matmul ``2·M·N·K``, an
elementwise op a few per element, a norm or softmax ~8 per element). The rates are those of a
modest emulated die — 50 GB/s and 50 GFLOP/s, 2 µs to start a kernel — picked so that the die time
charged is of the order of what numpy on one host core takes for the same op: the share's compute
policy then slices time that the aclserver really spends. They are constants, documented in
docs/pytorch.md ("Operator set and cost model").
"""

from __future__ import annotations

__all__ = ["BYTES_PER_NS", "FLOOR_NS", "FLOPS_PER_NS", "LAUNCH_NS", "die_time_ns"]

LAUNCH_NS = 2_000
"""Fixed cost of starting a kernel."""
FLOOR_NS = 2_000
"""No op holds the die for less."""
BYTES_PER_NS = 50
"""Memory rate: 50 GB/s."""
FLOPS_PER_NS = 50
"""Compute rate: 50 GFLOP/s."""


def die_time_ns(nbytes: int, flops: int) -> int:
    """The die time of an op that moves ``nbytes`` bytes and computes ``flops`` operations."""
    if nbytes < 0 or flops < 0:
        raise ValueError(f"negative cost: {nbytes} bytes, {flops} flops")
    return max(FLOOR_NS, LAUNCH_NS + nbytes // BYTES_PER_NS + flops // FLOPS_PER_NS)
