"""The emulated operator set: each aclop kernel against a reference computed another way, and every error.

References are written independently of the kernels: loops, ``math.erf``, float64 formulas. Outputs are
preallocated as the aclserver's views are, some of them strided, to show kernels write in place.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from flexnpu_runtime.aclserver import operators
from flexnpu_runtime.aclserver.operators import cost
from flexnpu_runtime.aclserver.operators.errors import (
    ACL_ERROR_OP_ATTR_NOT_MATCH,
    ACL_ERROR_OP_INPUT_NOT_MATCH,
    ACL_ERROR_OP_NOT_FOUND,
    ACL_ERROR_OP_OUTPUT_NOT_MATCH,
    ACL_ERROR_UNSUPPORTED_DATA_TYPE,
)

RNG = np.random.default_rng(7)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def run1(
    op: str, inputs: list[Any], shape: tuple[int, ...], dtype: Any = np.float32, **attrs: Any
) -> np.ndarray:
    out = np.full(shape, 12345, dtype=dtype)
    ns = operators.run(op, inputs, [out], attrs)
    assert ns >= cost.FLOOR_NS
    return out


X23, Y23, X3 = f32(2, 3), f32(2, 3), f32(3)
X234 = f32(2, 3, 4)


def gelu_ref(x: np.ndarray) -> np.ndarray:
    return np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.reshape(-1).tolist()]).reshape(
        x.shape
    )


def softmax_ref(x: np.ndarray) -> np.ndarray:
    rows = x.reshape(-1, x.shape[-1]).astype(np.float64)
    out = [[math.exp(v - max(r)) / sum(math.exp(w - max(r)) for w in r) for v in r] for r in rows.tolist()]
    return np.array(out).reshape(x.shape)


def layer_norm_ref(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    rows = x.reshape(-1, x.shape[-1]).astype(np.float64)
    out = []
    for r in rows:
        mean = sum(r) / len(r)
        var = sum((v - mean) ** 2 for v in r) / len(r)
        out.append([(v - mean) / math.sqrt(var + eps) for v in r])
    return np.array(out).reshape(x.shape) * g + b


G4, B4 = f32(4), f32(4)
IDS = np.array([[0, 2, 1], [3, 3, 0]], dtype=np.int64)
TABLE = f32(4, 5)

# (id, op, inputs, out shape, out dtype, attrs, expected)
CASES: list[Any] = [
    ("add", "Add", [X23, X3], (2, 3), np.float32, {}, X23 + X3),
    ("add-host-scalar", "Add", [X23, np.array(1.0, np.float32)], (2, 3), np.float32, {}, X23 + 1),
    ("sub", "Sub", [X23, Y23], (2, 3), np.float32, {}, X23 - Y23),
    ("mul-int", "Mul", [i64(1, 2, 3), i64(4, 5, 6)], (3,), np.int64, {}, [4, 10, 18]),
    ("realdiv", "RealDiv", [X23, np.array(4.0, np.float32)], (2, 3), np.float32, {}, X23 / 4),
    ("axpyv2", "AxpyV2", [X23, Y23, np.array(2.0, np.float32)], (2, 3), np.float32, {}, X23 + 2 * Y23),
    ("maximum", "Maximum", [X23, Y23], (2, 3), np.float32, {}, np.where(X23 > Y23, X23, Y23)),
    ("less-bool", "Less", [X23, Y23], (2, 3), np.bool_, {}, X23 < Y23),
    ("neg", "Neg", [X23], (2, 3), np.float32, {}, -X23),
    ("exp", "Exp", [X23], (2, 3), np.float32, {}, np.exp(X23.astype(np.float64))),
    ("rsqrt", "Rsqrt", [np.array([4.0, 0.25], np.float32)], (2,), np.float32, {}, [0.5, 2.0]),
    ("relu", "Relu", [X23], (2, 3), np.float32, {}, np.where(X23 > 0, X23, 0)),
    ("gelu-exact", "Gelu", [X234 * 3], (2, 3, 4), np.float32, {}, gelu_ref(X234 * 3)),
    ("swish-silu", "Swish", [X23], (2, 3), np.float32, {"scale": 1.0}, X23 / (1 + np.exp(-X23.astype(np.float64)))),
    ("cast-f32-i32-trunc", "Cast", [np.array([1.7, -1.7, 2.0], np.float32)], (3,), np.int32, {"dst_type": 3}, [1, -1, 2]),
    ("cast-f32-f16", "Cast", [X23], (2, 3), np.float16, {"dst_type": 1}, X23.astype(np.float16)),
    ("cast-to-bool", "Cast", [np.array([0.0, 2.0], np.float32)], (2,), np.bool_, {"dst_type": 12}, [False, True]),
    ("select", "Select", [X23 > 0, X23, Y23], (2, 3), np.float32, {}, np.where(X23 > 0, X23, Y23)),
    ("masked-fill", "MaskedFill", [X23, np.array([True, False, True]), np.array(-1e9, np.float32)], (2, 3),
     np.float32, {}, np.where([True, False, True], np.float32(-1e9), X23)),
    ("matmul", "MatMul", [X23, f32(3, 4) * 0 + 1], (2, 4), np.float32, {}, np.repeat(X23.sum(1, keepdims=True), 4, 1)),
    ("matmul-t2", "MatMul", [X23, Y23], (2, 2), np.float32, {"transpose_x2": True},
     [[float(np.dot(X23[i].astype(np.float64), Y23[j])) for j in range(2)] for i in range(2)]),
    ("matmulv2-bias", "MatMulV2", [X23, Y23, G4[:2]], (2, 2), np.float32, {"transpose_x1": False, "transpose_x2": True},
     X23.astype(np.float64) @ Y23.T.astype(np.float64) + G4[:2]),
    ("batchmatmul-adj", "BatchMatMul", [X234, X234], (2, 3, 3), np.float32, {"adj_x2": True},
     np.einsum("bik,bjk->bij", X234.astype(np.float64), X234.astype(np.float64))),
    ("softmax", "SoftmaxV2", [X234], (2, 3, 4), np.float32, {"axes": [-1]}, softmax_ref(X234)),
    ("softmax-masked-row", "SoftmaxV2", [np.array([[0.0, -np.inf], [1.0, 1.0]], np.float32)], (2, 2), np.float32,
     {"axes": [1]}, [[1.0, 0.0], [0.5, 0.5]]),
    ("layernorm", "LayerNorm", [X234, G4, B4], (2, 3, 4), np.float32,
     {"begin_norm_axis": 2, "begin_params_axis": 2, "epsilon": 1e-5}, layer_norm_ref(X234, G4, B4, 1e-5)),
    ("rmsnorm", "RmsNorm", [X234, G4], (2, 3, 4), np.float32, {"epsilon": 1e-6},
     X234 / np.sqrt((X234.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * G4),
    ("reducesum", "ReduceSum", [X234, i64(1)], (2, 4), np.float32, {"keep_dims": False}, X234.astype(np.float64).sum(1)),
    ("reducesum-empty-axes", "ReduceSum", [X23, i64()], (2, 3), np.float32, {}, X23),
    ("reducemean-keep", "ReduceMean", [X234, i64(-1)], (2, 3, 1), np.float32, {"keep_dims": True},
     X234.astype(np.float64).mean(-1, keepdims=True)),
    ("reducemax", "ReduceMax", [X234, i64(0, 2)], (3,), np.float32, {}, X234.max((0, 2))),
    ("argmaxv2", "ArgMaxV2", [X234, np.array([2], np.int32)], (2, 3), np.int64, {}, X234.argmax(2)),
    ("transpose", "Transpose", [X234, i64(2, 0, 1)], (4, 2, 3), np.float32, {}, X234.transpose(2, 0, 1)),
    ("concat", "ConcatD", [X23, Y23], (2, 6), np.float32, {"N": 2, "concat_dim": 1}, np.hstack([X23, Y23])),
    ("pack", "Pack", [X23, Y23], (2, 2, 3), np.float32, {"N": 2, "axis": 0}, np.array([X23, Y23])),
    ("stridedslice", "StridedSlice", [X234, i64(0, 1, 0), i64(2, 3, 4), i64(1, 1, 2)], (2, 2, 2), np.float32,
     {"begin_mask": 0, "end_mask": 0, "ellipsis_mask": 0, "new_axis_mask": 0, "shrink_axis_mask": 0},
     X234[:, 1:3, 0:4:2]),
    ("stridedslice-shrink", "StridedSlice", [X234, i64(0, 1), i64(0, 2), i64(1, 1)], (2, 4), np.float32,
     {"begin_mask": 1, "end_mask": 1, "shrink_axis_mask": 2}, X234[:, 1]),
    ("stridedsliced", "StridedSliceD", [X234], (2, 3, 2), np.float32, {"begin": [0, 0, 2], "end": [2, 3, 4],
     "strides": [1, 1, 1]}, X234[..., 2:4]),
    ("slice", "Slice", [X234, i64(1, 0, 1), i64(1, -1, 2)], (1, 3, 2), np.float32, {}, X234[1:2, :, 1:3]),
    ("gatherv2-embedding", "GatherV2", [TABLE, IDS, i64(0)], (2, 3, 5), np.float32, {"batch_dims": 0}, TABLE[IDS]),
    ("gatherv2-index-select", "GatherV2", [X234, i64(3, 0), i64(-1)], (2, 3, 2), np.float32, {}, X234[..., [3, 0]]),
    ("triu", "Triu", [np.ones((2, 3, 3), np.float32)], (2, 3, 3), np.float32, {"diagonal": 1},
     [[[0, 1, 1], [0, 0, 1], [0, 0, 0]]] * 2),
    ("tril-bool", "Tril", [np.ones((3, 3), np.bool_)], (3, 3), np.bool_, {"diagonal": 0},
     [[1, 0, 0], [1, 1, 0], [1, 1, 1]]),
    ("broadcastto", "BroadcastTo", [X3, i64(2, 3)], (2, 3), np.float32, {}, [X3, X3]),
    ("tile", "Tile", [X3, i64(2)], (6,), np.float32, {}, np.concatenate([X3, X3])),
    ("fill", "Fill", [i64(2, 3), np.array(7, np.int64)], (2, 3), np.float32, {}, np.full((2, 3), 7.0)),
    ("fill-0d-dims-1", "Fill", [i64(1), np.array(0.5, np.float32)], (), np.float32, {}, 0.5),
    ("oneslike", "OnesLike", [X23], (2, 3), np.float32, {}, np.ones((2, 3))),
    ("zeroslike-int", "ZerosLike", [IDS], (2, 3), np.int64, {}, np.zeros((2, 3))),
    ("range", "Range", [np.array(0.5), np.array(2.0), np.array(0.5)], (3,), np.float32, {}, [0.5, 1.0, 1.5]),
    ("range-int", "Range", [i64(0), i64(5), i64(2)], (3,), np.int64, {}, [0, 2, 4]),
    ("identity", "Identity", [X23], (2, 3), np.float32, {}, X23),
    ("reversev2", "ReverseV2", [X234, i64(-1, 0)], (2, 3, 4), np.float32, {}, X234[::-1, :, ::-1]),
    ("repeat-interleave", "RepeatInterleave", [X23, np.array(2, np.int64)], (2, 6), np.float32, {"axis": 1},
     X23[:, [0, 0, 1, 1, 2, 2]]),
    ("repeat-interleave-each", "RepeatInterleave", [X23, i64(0, 2)], (2, 3), np.float32, {"axis": 0}, X23[[1, 1]]),
    ("reducemeand", "ReduceMeanD", [X234], (2, 3), np.float32, {"axes": [-1]}, X234.astype(np.float64).mean(-1)),
    ("var-unbiased", "ReduceStdV2Update", [X234, X234.mean(-1, keepdims=True)], (2, 3), np.float32,
     {"dim": [2], "if_std": False, "unbiased": True, "keepdim": False, "correction": 1},
     X234.astype(np.float64).var(-1, ddof=1)),
    ("std-with-mean", "ReduceStdWithMean", [X234, X234.mean(1, keepdims=True)], (2, 1, 4), np.float32,
     {"dim": [1], "unbiased": False, "keepdim": True}, X234.astype(np.float64).std(1, keepdims=True)),
    ("clip", "ClipByValueV2", [X23, np.array(-0.5, np.float32), np.array(0.5, np.float32)], (2, 3), np.float32, {},
     np.minimum(np.maximum(X23, -0.5), 0.5)),
    ("cumsum", "Cumsum", [X234, np.array(2, np.int32)], (2, 3, 4), np.float32, {},
     [[[sum(X234[b, r, :c + 1].astype(np.float64)) for c in range(4)] for r in range(3)] for b in range(2)]),
    ("cumsum-exclusive-reverse", "Cumsum", [np.array([1, 2, 3], np.int64), i64(0)], (3,), np.int64,
     {"exclusive": True, "reverse": True}, [5, 3, 0]),
    ("index-one-dim", "Index", [X234, i64(0, 1), i64(2, 3, 3), i64(2, 0, 2)], (2, 3, 4), np.float32, {},
     X234[:, [2, 0, 2]]),
    ("index-two-dims", "Index", [X234, i64(1, 1), i64(2, 4), i64(1, 0), i64(2, 1)], (2, 4), np.float32, {},
     X234[[1, 0], [2, 1]]),
    ("index-bool-mask", "Index", [X23, i64(1), i64(1, 3), np.array([True, False])], (1, 3), np.float32, {},
     X23[[True, False]]),
    ("viewcopy-transpose", "ViewCopy",
     [np.zeros(6, np.float32), i64(3, 2), i64(1, 3), i64(0), X23.reshape(-1), i64(3, 2), i64(1, 3), i64(0)],
     (6,), np.float32, {}, X23.reshape(-1)),
    ("asstrided", "AsStrided", [X23.reshape(-1), i64(3, 2), i64(1, 3), i64(0)], (3, 2), np.float32, {}, X23.T),
    ("asstrided-offset", "AsStrided", [X23.reshape(-1), i64(2), i64(2), i64(1)], (2,), np.float32, {},
     X23.reshape(-1)[[1, 3]]),
]  # fmt: skip


@pytest.mark.parametrize(("op", "inputs", "shape", "dtype", "attrs", "expected"),
                         [pytest.param(*c[1:], id=c[0]) for c in CASES])  # fmt: skip
def test_aclop_kernel_matches_reference(op: str, inputs: list[Any], shape: Any, dtype: Any, attrs: Any,
                                        expected: Any) -> None:  # fmt: skip
    if op == "ViewCopy":
        out = inputs[0]  # ViewCopy writes its first input's memory
        operators.run(op, inputs, [out], attrs)
    else:
        out = run1(op, inputs, shape, dtype, **attrs)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_allclose(
        out.astype(np.float64), np.asarray(expected, dtype=np.float64), rtol=2e-6, atol=2e-6
    )


def test_every_case_op_is_known_and_the_gpt_block_set_is_covered() -> None:
    gpt_block = {"GatherV2", "LayerNorm", "MatMul", "MatMulV2", "BatchMatMul", "Add", "Mul", "RealDiv", "SoftmaxV2",
                 "MaskedFill", "Triu", "Tril", "Gelu", "Transpose", "ViewCopy", "AsStrided", "Cast", "Fill",
                 "OnesLike", "ZerosLike", "Range", "ConcatD", "StridedSlice", "Select", "Identity"}  # fmt: skip
    assert gpt_block <= frozenset(operators.KERNELS)
    assert {c[1] for c in CASES} <= frozenset(operators.KERNELS)


def test_top_k_gives_values_and_indices_largest_first() -> None:
    x = np.array([[3.0, 1.0, 3.0, 7.0], [0.0, -1.0, 5.0, 2.0]], np.float32)
    values, indices = np.zeros((2, 2), np.float32), np.zeros((2, 2), np.int32)
    operators.run(
        "TopKV2",
        [x, np.array([2], np.int32)],
        [values, indices],
        {"dim": -1, "largest": True, "sorted": True},
    )
    np.testing.assert_array_equal(values, [[7, 3], [5, 2]])
    np.testing.assert_array_equal(indices, [[3, 0], [2, 3]])  # a tie keeps the lower index first
    operators.run("TopKV2", [x, np.array([2], np.int32)], [values, indices], {"dim": 1, "largest": False})
    np.testing.assert_array_equal(values, [[1, 3], [-1, 0]])
    with pytest.raises(operators.OperatorError, match="k 5 is outside"):
        operators.run("TopKV2", [x, np.array([5], np.int32)], [values, indices], {"dim": 1})


def test_outputs_are_written_in_place_through_strided_views() -> None:
    storage = np.zeros((3, 2), np.float32)
    out = storage.T  # a (2, 3) view with strides (4, 8): not contiguous
    operators.run("Add", [X23, Y23], [out], {})
    np.testing.assert_allclose(storage, (X23 + Y23).T)


def test_float16_is_computed_in_float32_and_written_as_float16() -> None:
    x = np.array([60000.0, 1.0], np.float16)
    out = run1("ReduceSum", [np.stack([x, x]), i64(0)], (2,), np.float16)
    assert out.dtype == np.float16
    assert out[1] == 2.0 and np.isinf(out[0])  # 120000 overflows float16 only when written


def test_a_gpt_style_attention_chain_matches_a_float64_reference() -> None:
    q, k, v = f32(2, 4, 8), f32(2, 4, 8), f32(2, 4, 8)
    scores = run1("BatchMatMul", [q, k], (2, 4, 4), adj_x2=True)
    scaled = run1("RealDiv", [scores, np.array(math.sqrt(8), np.float32)], (2, 4, 4))
    mask = run1("Triu", [np.ones((4, 4), np.bool_)], (4, 4), np.bool_, diagonal=1)
    masked = run1("MaskedFill", [scaled, mask, np.array(-np.inf, np.float32)], (2, 4, 4))
    probs = run1("SoftmaxV2", [masked], (2, 4, 4), axes=[-1])
    att = run1("BatchMatMul", [probs, v], (2, 4, 8))
    ref_s = np.einsum("bid,bjd->bij", q.astype(np.float64), k) / math.sqrt(8)
    ref_s[:, np.triu(np.ones((4, 4), bool), 1)] = -np.inf
    ref_p = np.exp(ref_s - ref_s.max(-1, keepdims=True))
    ref_p /= ref_p.sum(-1, keepdims=True)
    np.testing.assert_allclose(att, ref_p @ v, atol=1e-5)


# -- errors -----------------------------------------------------------------------------------------

ERRORS: list[Any] = [
    ("unknown-op", "NoSuchOp", [X23], [(2, 3)], {}, ACL_ERROR_OP_NOT_FOUND, "'NoSuchOp'"),
    ("missing-input", "MatMul", [X23], [(2, 2)], {}, ACL_ERROR_OP_INPUT_NOT_MATCH, "input 1 (x2) is missing"),
    ("missing-output", "Add", [X23, Y23], [], {}, ACL_ERROR_OP_OUTPUT_NOT_MATCH, "output 0 (y) is missing"),
    ("shape-mismatch-matmul", "MatMul", [X23, X23], [(2, 3)], {}, ACL_ERROR_OP_INPUT_NOT_MATCH, "[2, 3] and [2, 3]"),
    ("no-broadcast", "Add", [X23, f32(4)], [(2, 3)], {}, ACL_ERROR_OP_INPUT_NOT_MATCH, "do not broadcast"),
    ("wrong-out-shape", "Add", [X23, Y23], [(3, 2)], {}, ACL_ERROR_OP_OUTPUT_NOT_MATCH, "output 0 has shape [3, 2]"),
    ("float-op-on-ints", "Exp", [i64(1, 2)], [(2,)], {}, ACL_ERROR_UNSUPPORTED_DATA_TYPE, "int64"),
    ("missing-attr", "ConcatD", [X23, Y23], [(2, 6)], {"N": 2}, ACL_ERROR_OP_ATTR_NOT_MATCH, "'concat_dim' is missing"),
    ("attr-wrong-kind", "Triu", [X23], [(2, 3)], {"diagonal": "1"}, ACL_ERROR_OP_ATTR_NOT_MATCH, "must be an int"),
    ("attr-bool-not-int", "Triu", [X23], [(2, 3)], {"diagonal": True}, ACL_ERROR_OP_ATTR_NOT_MATCH, "'diagonal'"),
    ("axis-out-of-range", "SoftmaxV2", [X23], [(2, 3)], {"axes": [2]}, ACL_ERROR_OP_ATTR_NOT_MATCH, "out of range"),
    ("cast-unsupported-dtype", "Cast", [X23], [(2, 3)], {"dst_type": 16}, ACL_ERROR_UNSUPPORTED_DATA_TYPE,
     "aclDataType 16"),
    ("cast-dst-type-mismatch", "Cast", [X23], [(2, 3)], {"dst_type": 9}, ACL_ERROR_OP_ATTR_NOT_MATCH, "int64"),
    ("gather-index-out-of-range", "GatherV2", [TABLE, i64(4), i64(0)], [(1, 5)], {}, ACL_ERROR_OP_INPUT_NOT_MATCH,
     "outside [-4, 4)"),
    ("asstrided-beyond-buffer", "AsStrided", [X23.reshape(-1), i64(3, 3), i64(1, 3), i64(0)], [(3, 3)], {},
     ACL_ERROR_OP_INPUT_NOT_MATCH, "reaches element 8 of a buffer of 6"),
    ("viewcopy-negative-stride", "ViewCopy",
     [np.zeros(6, np.float32), i64(3), i64(-1), i64(0), X3, i64(3), i64(1), i64(0)], [(6,)], {},
     ACL_ERROR_OP_INPUT_NOT_MATCH, "negative"),
    ("range-wrong-length", "Range", [i64(0), i64(5), i64(1)], [(4,)], {}, ACL_ERROR_OP_INPUT_NOT_MATCH,
     "5 elements"),
    ("range-zero-delta", "Range", [i64(0), i64(5), i64(0)], [(4,)], {}, ACL_ERROR_OP_INPUT_NOT_MATCH, "delta 0"),
    ("layernorm-gamma-shape", "LayerNorm", [X234, f32(3), B4], [(2, 3, 4)], {"begin_norm_axis": -1},
     ACL_ERROR_OP_INPUT_NOT_MATCH, "gamma [3]"),
    ("concat-N-mismatch", "ConcatD", [X23, Y23], [(2, 6)], {"N": 3, "concat_dim": 1}, ACL_ERROR_OP_ATTR_NOT_MATCH,
     "'N' is 3"),
    ("transpose-bad-perm", "Transpose", [X234, i64(0, 0, 1)], [(2, 2, 3)], {}, ACL_ERROR_OP_INPUT_NOT_MATCH,
     "not a permutation"),
    ("fill-dims-mismatch", "Fill", [i64(4, 2), np.array(1.0)], [(2, 3)], {}, ACL_ERROR_OP_INPUT_NOT_MATCH,
     "(dims) [4, 2]"),
]  # fmt: skip


@pytest.mark.parametrize(("op", "inputs", "shapes", "attrs", "code", "words"),
                         [pytest.param(*c[1:], id=c[0]) for c in ERRORS])  # fmt: skip
def test_bad_calls_raise_the_acl_error_naming_op_and_field(
    op: str, inputs: list[Any], shapes: list[Any], attrs: Any, code: int, words: str
) -> None:
    outputs = [np.full(s, 99, np.float32) for s in shapes]
    with pytest.raises(operators.OperatorError) as info:
        operators.run(op, inputs, outputs, attrs)
    assert info.value.code == code
    assert op in str(info.value) and words in str(info.value)
    for out in outputs:  # nothing was written
        assert (out == 99).all()


def test_unknown_operator_is_an_operator_error_naming_the_op() -> None:
    with pytest.raises(operators.UnknownOperator) as info:
        operators.run("FlashAttentionScore", [], [], {})
    assert isinstance(info.value, operators.OperatorError)
    assert info.value.op == "FlashAttentionScore"


# -- cost model ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nbytes", "flops", "expected"),
    [(0, 0, cost.FLOOR_NS), (50_000, 0, cost.LAUNCH_NS + 1000), (0, 50_000_000, cost.LAUNCH_NS + 1_000_000)],
)
def test_cost_model(nbytes: int, flops: int, expected: int) -> None:
    assert cost.die_time_ns(nbytes, flops) == expected


def test_die_time_grows_with_the_matmul_flops() -> None:
    small = operators.run("MatMul", [f32(8, 8), f32(8, 8)], [np.empty((8, 8), np.float32)], {})
    a, b = f32(128, 128), f32(128, 128)
    big = operators.run("MatMul", [a, b], [np.empty((128, 128), np.float32)], {})
    flops, nbytes = 2 * 128**3, 3 * 128 * 128 * 4
    assert big == cost.LAUNCH_NS + nbytes // cost.BYTES_PER_NS + flops // cost.FLOPS_PER_NS
    assert big > 40 * small


def test_docs_name_every_op_of_the_set() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "pytorch.md").read_text()
    missing = [
        op
        for op in sorted(frozenset(operators.KERNELS))
        if f"`{op}`" not in doc and not (op.startswith("aclnnInplace") and f"`aclnn{op[12:]}`" in doc)
    ]
    assert not missing, f"docs/pytorch.md's operator table lacks {missing}"


# -- bfloat16 ----------------------------------------------------------------------------------------

BF16 = operators.calls.BF16


def bf16(values: Any) -> np.ndarray:
    """float32 values (exactly representable) as a BF16 array."""
    bits = (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return bits.view(BF16)


def test_bfloat16_operands_are_computed_as_float32_and_rounded_to_nearest_even() -> None:
    a, b = bf16([1.0, 2.5, -3.0]), bf16([0.5, 0.25, 1.0])
    out = np.zeros(3, BF16)
    operators.run("Add", [a, b], [out], {})
    np.testing.assert_array_equal(operators.calls.from_bf16(out), [1.5, 2.75, -2.0])
    # 1 + 2**-8 lies halfway between bfloat16 neighbours 1 and 1 + 2**-7: ties go to the even one (1.0);
    # 1 + 3 * 2**-8 rounds up to 1 + 2**-6
    half = np.zeros(2, BF16)
    operators.run("Cast", [np.array([1 + 2**-8, 1 + 3 * 2**-8], np.float32)], [half], {"dst_type": 27})
    np.testing.assert_array_equal(operators.calls.from_bf16(half), [1.0, 1 + 2**-6])
    nan = np.zeros(1, BF16)
    operators.run("Cast", [np.array([np.nan], np.float32)], [nan], {"dst_type": 27})
    assert np.isnan(operators.calls.from_bf16(nan)).all()


def test_bfloat16_through_matmul_gather_inplace_and_a_strided_view() -> None:
    w = bf16(np.arange(12, dtype=np.float32).reshape(4, 3))
    out = np.zeros((2, 3), BF16)
    operators.run("GatherV2", [w, i64(3, 1), i64(0)], [out], {})
    np.testing.assert_array_equal(operators.calls.from_bf16(out), [[9, 10, 11], [3, 4, 5]])
    mm = np.zeros((4, 4), BF16)
    operators.run("aclnnMatmul", [w, np.swapaxes(w, 0, 1)], [mm], {"cubeMathType": 0})
    ref = np.arange(12, dtype=np.float64).reshape(4, 3)
    np.testing.assert_allclose(operators.calls.from_bf16(mm), ref @ ref.T, rtol=2**-8)
    storage = np.zeros((3, 2), BF16)
    operators.run("aclnnInplaceOne", [], [storage.T], {})
    operators.run("aclnnInplaceMuls", [], [storage.T], {"other": 3})
    np.testing.assert_array_equal(operators.calls.from_bf16(storage), np.full((3, 2), 3.0))
    ones = np.zeros(3, BF16)
    operators.run("OnesLike", [ones], [ones], {})
    np.testing.assert_array_equal(operators.calls.from_bf16(ones), [1, 1, 1])
