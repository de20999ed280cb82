"""Fused attention: ``aclnnFlashAttentionScore`` (torch_npu's ``scaled_dot_product_attention`` on an A2/A3
die, and ``npu_fusion_attention``), computed as ``softmax(q·kᵀ·scale + pse, masked) · v``.

Layouts (``inputLayout``): ``BNSD``, ``BSND``, ``BSH`` and ``SBH`` (``headNum`` heads of ``H / headNum``);
grouped-query key/value heads (a divisor of the query's) are repeated. ``attenMaskOptional`` is bool or
uint8 with 1 where a query may NOT attend a key, as CANN's; ``sparseMode`` 0 (the mask as given, broadcast
from [S1, S2], [B, 1, S1, S2] or [B, N, S1, S2], plus the ``preTokens``/``nextTokens`` band), 1 (the mask as
given), 2 (causal from the top left: key j > query i is masked; the mask passed is CANN's compressed 2048 x 2048
one and is not read) and 3 (causal from the bottom right: j > i + S2 - S1). Dropout (``keepProb`` < 1), the
padding mask, a prefix and the other sparse modes are refused. Outputs: the attention in the query's layout,
and the softmax statistics CANN's backward reads — each query's row maximum and sum of exponentials,
[B, N, S1, 8] (the value repeated over the last dim); a row with every key masked gives zeros.
"""

from __future__ import annotations

import numpy as np

from flexnpu_runtime.aclserver.operators.calls import Array, Call, store

__all__ = ["flash_attention"]

LAYOUTS = ("BNSD", "BSND", "BSH", "SBH")


def _to_bnsd(call: Call, x: Array, layout: str, heads: int, name: str) -> Array:
    """``x`` as [B, N, S, D] (a view where it can be)."""
    want = 3 if layout in ("BSH", "SBH") else 4
    if x.ndim != want:
        raise call.bad_input(f"{name} has shape {list(x.shape)}, layout {layout} needs {want} dims")
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return np.swapaxes(x, 1, 2)
    bsh = x if layout == "BSH" else np.swapaxes(x, 0, 1)
    b, s, h = bsh.shape
    if heads <= 0 or h % heads:
        raise call.bad_attr(f"headNum {heads} does not divide {name}'s hidden size {h}")
    return np.swapaxes(bsh.reshape(b, s, heads, h // heads), 1, 2)


def _from_bnsd(x: Array, layout: str) -> Array:
    if layout == "BNSD":
        return x
    bsnd = np.swapaxes(x, 1, 2)
    if layout == "BSND":
        return bsnd
    b, s, n, d = bsnd.shape
    bsh = bsnd.reshape(b, s, n * d)
    return bsh if layout == "BSH" else np.swapaxes(bsh, 0, 1)


def _mask(
    call: Call, mode: int, given: Array | None, shape: tuple[int, ...], band: tuple[int, int]
) -> Array | None:
    """The bool mask (True: masked) over [B, N, S1, S2], or None when nothing is masked."""
    s1, s2 = shape[-2], shape[-1]
    i = np.arange(s1)[:, None]
    j = np.arange(s2)[None, :]
    if mode == 2:
        return np.broadcast_to(j > i, shape)
    if mode == 3:
        return np.broadcast_to(j > i + (s2 - s1), shape)
    masked: Array | None = None
    if given is not None:
        if given.dtype.kind not in "bu":
            raise call.bad_input(f"attenMaskOptional has dtype {given.dtype.name}; bool or uint8 is needed")
        try:
            masked = np.broadcast_to(given.astype(bool), shape)
        except ValueError:
            raise call.bad_input(
                f"attenMaskOptional {list(given.shape)} does not broadcast to {list(shape)}"
            ) from None
    elif mode == 1:
        raise call.bad_input("sparseMode 1 needs attenMaskOptional")
    pre, nxt = band
    if mode == 0 and (pre < s1 + s2 or nxt < s1 + s2):
        outside = (j < i - pre) | (j > i + nxt)
        masked = outside if masked is None else masked | outside
    return None if masked is None else np.broadcast_to(masked, shape)


def flash_attention(
    call: Call,
    q: Array,
    k: Array,
    v: Array,
    *,
    pse: Array | None,
    mask: Array | None,
    params: dict[str, int | float | str],
) -> tuple[Array, Array, Array, int]:
    """(attention in the query's layout, row max [B, N, S1, 1], row sum [B, N, S1, 1], flops)."""
    layout = str(params["inputLayout"])
    if layout not in LAYOUTS:
        raise call.bad_attr(f"inputLayout {layout!r} is not one of {', '.join(LAYOUTS)}")
    heads = int(params["headNum"])
    for array, name in ((q, "query"), (k, "key"), (v, "value")):
        call.float_dtype(array, name)
    qb = _to_bnsd(call, q, layout, heads, "query").astype(np.float64)
    kb = _to_bnsd(
        call, k, layout, heads if layout in ("BNSD", "BSND") else _kv_heads(call, q, k, heads), "key"
    )
    vb = _to_bnsd(call, v, layout, kb.shape[1], "value")
    b, n, s1, d = qb.shape
    if kb.shape[0] != b or kb.shape[3] != d or vb.shape[:3] != kb.shape[:3] or n % kb.shape[1]:
        raise call.bad_input(
            f"query {list(qb.shape)}, key {list(kb.shape)} and value {list(vb.shape)} (BNSD) do not fit"
        )
    group = n // kb.shape[1]
    kb = np.repeat(kb.astype(np.float64), group, axis=1)
    vb = np.repeat(vb.astype(np.float64), group, axis=1)
    s2 = kb.shape[2]
    scores = np.matmul(qb, np.swapaxes(kb, -1, -2)) * float(params["scaleValue"])
    if pse is not None:
        try:
            scores = scores + pse.astype(np.float64)
        except ValueError:
            raise call.bad_input(
                f"realShiftOptional {list(pse.shape)} does not broadcast to {list(scores.shape)}"
            ) from None
    masked = _mask(
        call,
        int(params["sparseMode"]),
        mask,
        scores.shape,
        (int(params["preTokens"]), int(params["nextTokens"])),
    )
    if masked is not None:
        scores = np.where(masked, -np.inf, scores)
    row_max = np.max(scores, axis=-1, keepdims=True)
    safe_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.exp(scores - safe_max)
    row_sum = np.sum(e, axis=-1, keepdims=True)
    probs = np.divide(e, row_sum, out=np.zeros_like(e), where=row_sum > 0)
    out = np.matmul(probs, vb)
    return _from_bnsd(out, layout), row_max, row_sum, 4 * b * n * s1 * s2 * d


def _kv_heads(call: Call, q: Array, k: Array, heads: int) -> int:
    """Heads of a BSH/SBH key: its hidden size over the query's head dim."""
    h_q, h_k = int(q.shape[-1]), int(k.shape[-1])
    if heads <= 0 or h_q % heads or h_k % (h_q // heads):
        raise call.bad_attr(f"headNum {heads} does not fit query hidden {h_q} and key hidden {h_k}")
    return h_k // (h_q // heads)


def store_stat(call: Call, index: int, out: Array, value: Array) -> None:
    """A [B, N, S1, 1] statistic into CANN's [B, N, S1, 8] output (repeated over the last dim)."""
    try:
        store(call.op, index, out, np.broadcast_to(value, out.shape))
    except ValueError:
        raise call.bad_input(
            f"output {index} has shape {list(out.shape)}, the statistic {list(value.shape)}"
        ) from None
