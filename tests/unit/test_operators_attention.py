"""aclnnFlashAttentionScore against a float64 reference written with loops: layouts, grouped-query heads,
masks and the causal sparse modes, the softmax statistics, and what is refused."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from flexnpu_runtime.aclserver import operators
from flexnpu_runtime.aclserver.operators.errors import (
    ACL_ERROR_OP_ATTR_NOT_MATCH,
    ACL_ERROR_OP_INPUT_NOT_MATCH,
)

RNG = np.random.default_rng(5)
B, N, S1, S2, D = 2, 4, 5, 6, 8


def reference(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, masked: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BNSD loops: attention, row max, row sum; masked(b, n, i, j) says a key is hidden."""
    b_, n_, s1, d = q.shape
    s2, group = k.shape[2], n_ // k.shape[1]
    out = np.zeros((b_, n_, s1, d))
    mx = np.zeros((b_, n_, s1))
    sm = np.zeros((b_, n_, s1))
    for b in range(b_):
        for n in range(n_):
            for i in range(s1):
                s = [-math.inf if masked(b, n, i, j) else float(np.dot(q[b, n, i], k[b, n // group, j])) / math.sqrt(d)
                     for j in range(s2)]  # fmt: skip
                m = max(s)
                w = [math.exp(x - m) for x in s]
                mx[b, n, i], sm[b, n, i] = m, sum(w)
                out[b, n, i] = sum(w[j] / sum(w) * v[b, n // group, j] for j in range(s2))
    return out, mx, sm


def call(q: np.ndarray, k: np.ndarray, v: np.ndarray, layout: str, heads: int, *, mask: Any = None,
         mode: int = 0, pre: int = 2**31 - 1, nxt: int = 2**31 - 1, shape: tuple[int, ...]) -> list[np.ndarray]:  # fmt: skip
    outs = [np.zeros((B, N, S1, 8), np.float32), np.zeros((B, N, S1, 8), np.float32), np.zeros(0, np.float32),
            np.zeros(shape, np.float32)]  # fmt: skip
    attrs = {"scaleValue": 1 / math.sqrt(D), "keepProb": 1.0, "preTokens": pre, "nextTokens": nxt, "headNum": heads,
             "inputLayout": layout, "innerPrecise": 0, "sparseMode": mode, "prefixOptional": []}  # fmt: skip
    operators.run("aclnnFlashAttentionScore", [q, k, v, None, None, None, mask], outs, attrs)
    return outs


Q = RNG.standard_normal((B, N, S1, D)).astype(np.float32)
K = RNG.standard_normal((B, N, S2, D)).astype(np.float32)
V = RNG.standard_normal((B, N, S2, D)).astype(np.float32)


def check(outs: list[np.ndarray], want: tuple[np.ndarray, np.ndarray, np.ndarray], to_layout: Any) -> None:
    np.testing.assert_allclose(outs[3], to_layout(want[0]), atol=1e-5)
    np.testing.assert_allclose(outs[0], np.repeat(want[1][..., None], 8, -1), atol=1e-5)
    np.testing.assert_allclose(outs[1], np.repeat(want[2][..., None], 8, -1), rtol=1e-5)


LAYOUTS = [
    ("BNSD", lambda x: x, (B, N, S1, D)),
    ("BSND", lambda x: x.transpose(0, 2, 1, 3), (B, S1, N, D)),
    ("BSH", lambda x: x.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1), (B, S1, N * D)),
    ("SBH", lambda x: x.transpose(2, 0, 1, 3).reshape(x.shape[2], x.shape[0], -1), (S1, B, N * D)),
]


@pytest.mark.parametrize(("layout", "to", "shape"), LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_every_layout_without_a_mask(layout: str, to: Any, shape: tuple[int, ...]) -> None:
    outs = call(to(Q), to(K), to(V), layout, N, shape=shape)
    check(outs, reference(Q, K, V, lambda b, n, i, j: False), to)


def test_grouped_query_heads_repeat_the_key_and_value_heads() -> None:
    k2, v2 = K[:, :2], V[:, :2]  # 4 query heads over 2 key/value heads
    outs = call(Q, k2, v2, "BNSD", N, shape=(B, N, S1, D))
    check(outs, reference(Q, k2, v2, lambda b, n, i, j: False), lambda x: x)


@pytest.mark.parametrize(
    ("mode", "hidden"),
    [(2, lambda b, n, i, j: j > i), (3, lambda b, n, i, j: j > i + (S2 - S1))],
    ids=["left-up-causal", "right-down-causal"],
)
def test_causal_sparse_modes_ignore_the_compressed_mask(mode: int, hidden: Any) -> None:
    compressed = np.triu(np.ones((2048, 2048), np.bool_), 1)
    outs = call(Q, K, V, "BNSD", N, mask=compressed, mode=mode, nxt=0, shape=(B, N, S1, D))
    check(outs, reference(Q, K, V, hidden), lambda x: x)


def test_a_given_mask_broadcasts_and_the_band_of_mode_0_applies() -> None:
    mask = RNG.random((S1, S2)) < 0.3
    mask[:, 0] = False  # no row all hidden
    outs = call(Q, K, V, "BNSD", N, mask=mask.astype(np.uint8), pre=1, nxt=1, shape=(B, N, S1, D))
    check(
        outs, reference(Q, K, V, lambda b, n, i, j: bool(mask[i, j]) or j < i - 1 or j > i + 1), lambda x: x
    )


@pytest.mark.parametrize(
    ("attrs", "code", "words"),
    [
        ({"keepProb": 0.9}, ACL_ERROR_OP_ATTR_NOT_MATCH, "dropout"),
        ({"sparseMode": 4}, ACL_ERROR_OP_ATTR_NOT_MATCH, "sparseMode 4"),
        ({"inputLayout": "TND"}, ACL_ERROR_OP_ATTR_NOT_MATCH, "inputLayout 'TND'"),
        ({"inputLayout": "BSH", "headNum": 3}, ACL_ERROR_OP_INPUT_NOT_MATCH, "layout BSH needs 3 dims"),
        ({"prefixOptional": [1]}, ACL_ERROR_OP_INPUT_NOT_MATCH, "prefixOptional"),
    ],
    ids=["dropout", "sparse-mode", "layout", "layout-dims", "prefix"],
)
def test_what_is_not_supported_is_refused_naming_it(attrs: dict[str, Any], code: int, words: str) -> None:
    base = {"scaleValue": 0.5, "keepProb": 1.0, "preTokens": 9, "nextTokens": 9, "headNum": N, "inputLayout": "BNSD",
            "innerPrecise": 0, "sparseMode": 0}  # fmt: skip
    outs = [np.zeros((B, N, S1, 8), np.float32), np.zeros((B, N, S1, 8), np.float32), None,
            np.zeros((B, N, S1, D), np.float32)]  # fmt: skip
    with pytest.raises(operators.OperatorError) as info:
        operators.run("aclnnFlashAttentionScore", [Q, K, V, None, None, None, None], outs, {**base, **attrs})
    assert (
        info.value.code == code and words in str(info.value) and "aclnnFlashAttentionScore" in str(info.value)
    )
    assert not outs[3].any()
