"""The aclnn functions over the operator set: parameters by CANN's names, Inplace writes, optional tensors,
tensor lists, and the C table (libascendcl/api/aclnn_api.json) agreeing with the Python specs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flexnpu_runtime.aclserver import operators
from flexnpu_runtime.aclserver.operators import aclnn
from flexnpu_runtime.aclserver.operators.errors import (
    ACL_ERROR_OP_ATTR_NOT_MATCH,
    ACL_ERROR_OP_INPUT_NOT_MATCH,
)

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(11)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


X, Y = f32(2, 3), f32(2, 3)
X3 = f32(2, 3, 4)
W, B = f32(4), f32(4)

# (id, function, inputs, outputs (shape, dtype), attrs, expected outputs)
CASES: list[Any] = [
    ("adds-int-scalars", "aclnnAdds", [X], [((2, 3), np.float32)], {"other": 1, "alpha": 1}, [X + 1]),
    ("add-alpha", "aclnnAdd", [X, Y], [((2, 3), np.float32)], {"alpha": 2.0}, [X + 2 * Y]),
    ("subs", "aclnnSubs", [X], [((2, 3), np.float32)], {"other": 0.5, "alpha": 2}, [X - 1.0]),
    ("muls", "aclnnMuls", [X], [((2, 3), np.float32)], {"other": 3.0}, [X * 3]),
    ("div-int-to-float", "aclnnDiv", [np.array([1, 3], np.int64), np.array([2, 2], np.int64)],
     [((2,), np.float32)], {}, [[0.5, 1.5]]),
    ("matmul-1d-2d", "aclnnMatmul", [np.ones(3, np.float32), X.T.copy()], [((2,), np.float32)],
     {"cubeMathType": 0}, [X.sum(1)]),
    ("matmul-4d", "aclnnMatmul", [f32(2, 2, 3, 4) * 0 + 1, np.ones((4, 5), np.float32)],
     [((2, 2, 3, 5), np.float32)], {"cubeMathType": 1}, [np.full((2, 2, 3, 5), 4.0)]),
    ("mm", "aclnnMm", [X, Y.T.copy()], [((2, 2), np.float32)], {"cubeMathType": 0}, [X @ Y.T]),
    ("addmm", "aclnnAddmm", [B[:2], X, Y.T.copy()], [((2, 2), np.float32)],
     {"beta": 1, "alpha": 1, "cubeMathType": 0}, [X @ Y.T + B[:2]]),
    ("bmm", "aclnnBatchMatMul", [X3, np.swapaxes(X3, 1, 2).copy()], [((2, 3, 3), np.float32)],
     {"cubeMathType": 0}, [X3 @ np.swapaxes(X3, 1, 2)]),
    ("softmax", "aclnnSoftmax", [X], [((2, 3), np.float32)], {"dim": 0},
     [np.exp(X) / np.exp(X).sum(0, keepdims=True)]),
    ("layernorm-optional-absent", "aclnnLayerNorm", [X3, None, None],
     [((2, 3, 4), np.float32), ((2, 3, 1), np.float32), ((2, 3, 1), np.float32)],
     {"normalizedShape": [4], "eps": 1e-5},
     [(X3 - X3.mean(-1, keepdims=True)) / np.sqrt(X3.var(-1, keepdims=True) + 1e-5), X3.mean(-1, keepdims=True),
      1 / np.sqrt(X3.var(-1, keepdims=True) + 1e-5)]),
    ("layernorm-affine", "aclnnLayerNorm", [X3, W, B], [((2, 3, 4), np.float32)],
     {"normalizedShape": [4], "eps": 1e-5},
     [(X3 - X3.mean(-1, keepdims=True)) / np.sqrt(X3.var(-1, keepdims=True) + 1e-5) * W + B]),
    ("rmsnorm", "aclnnRmsNorm", [X3, W], [((2, 3, 4), np.float32), ((2, 3, 1), np.float32)], {"epsilon": 1e-6},
     [X3 / np.sqrt((X3**2).mean(-1, keepdims=True) + 1e-6) * W, 1 / np.sqrt((X3**2).mean(-1, keepdims=True) + 1e-6)]),
    ("gelu", "aclnnGelu", [X], [((2, 3), np.float32)], {},
     [np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(X.astype(np.float64))]),
    ("silu", "aclnnSilu", [X], [((2, 3), np.float32)], {}, [X / (1 + np.exp(-X))]),
    ("embedding", "aclnnEmbedding", [W.reshape(4, 1) * [1, 2], np.array([[3, 0]], np.int64)],
     [((1, 2, 2), np.float32)], {}, [[[[W[3], 2 * W[3]], [W[0], 2 * W[0]]]]]),
    ("index-select", "aclnnIndexSelect", [X3, np.array([2, 0], np.int32)], [((2, 3, 2), np.float32)], {"dim": 2},
     [X3[..., [2, 0]]]),
    ("cat-list-of-three", "aclnnCat", [X, Y, X], [((6, 3), np.float32)], {"dim": 0}, [np.vstack([X, Y, X])]),
    ("slice-step", "aclnnSlice", [X3], [((2, 3, 2), np.float32)], {"dim": -1, "start": 0, "end": 100, "step": 2},
     [X3[..., ::2]]),
    ("triu", "aclnnTriu", [np.ones((3, 3), np.float32)], [((3, 3), np.float32)], {"diagonal": 1},
     [np.triu(np.ones((3, 3)), 1)]),
    ("reducesum-all", "aclnnReduceSum", [X3], [((), np.float32)], {"dims": [], "keepDims": False, "dtype": 0},
     [X3.sum()]),
    ("mean-keep", "aclnnMean", [X3], [((2, 1, 4), np.float32)], {"dim": [1], "keepDim": True, "dtype": 0},
     [X3.mean(1, keepdims=True)]),
    ("max", "aclnnMax", [X3], [((), np.float32)], {}, [X3.max()]),
    ("maxdim", "aclnnMaxDim", [X3], [((2, 3), np.float32), ((2, 3), np.int64)], {"dim": 2, "keepdim": False},
     [X3.max(2), X3.argmax(2)]),
    ("argmax", "aclnnArgMax", [X3], [((2, 4), np.int64)], {"dim": 1, "keepdim": False}, [X3.argmax(1)]),
    ("swhere", "aclnnSWhere", [X > 0, X, Y], [((2, 3), np.float32)], {}, [np.where(X > 0, X, Y)]),
    ("arange", "aclnnArange", [], [((4,), np.int64)], {"start": 1, "end": 9, "step": 2}, [[1, 3, 5, 7]]),
    ("cast", "aclnnCast", [X], [((2, 3), np.float16)], {"dtype": 1}, [X.astype(np.float16)]),
    ("permute", "aclnnPermute", [X3], [((4, 2, 3), np.float32)], {"dims": [2, 0, 1]}, [X3.transpose(2, 0, 1)]),
    ("expand", "aclnnExpand", [W], [((3, 4), np.float32)], {"size": [3, -1]}, [[W, W, W]]),
    ("eq-scalar", "aclnnEqScalar", [np.array([1, 2], np.int64)], [((2,), np.bool_)], {"other": 2}, [[False, True]]),
    ("pow", "aclnnPowTensorScalar", [X], [((2, 3), np.float32)], {"exponent": 2}, [X * X]),
    ("pow-tensor", "aclnnPowTensorTensor", [np.abs(X), Y * 0 + 2], [((2, 3), np.float32)], {}, [X * X]),
    ("logical-not", "aclnnLogicalNot", [X > 0], [((2, 3), np.bool_)], {}, [X <= 0]),
    ("logical-and", "aclnnLogicalAnd", [X > 0, Y > 0], [((2, 3), np.bool_)], {}, [(X > 0) & (Y > 0)]),
    ("maximum", "aclnnMaximum", [X, Y], [((2, 3), np.float32)], {}, [np.maximum(X, Y)]),
    ("log", "aclnnLog", [np.abs(X) + 1], [((2, 3), np.float32)], {}, [np.log(np.abs(X) + 1)]),
    ("gelu-v2-tanh", "aclnnGeluV2", [X], [((2, 3), np.float32)], {"approximate": 1},
     [0.5 * X * (1 + np.tanh(np.sqrt(2 / np.pi) * (X + 0.044715 * X**3)))]),
    ("gelu-v2-none", "aclnnGeluV2", [X], [((2, 3), np.float32)], {"approximate": 0},
     [np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(X.astype(np.float64))]),
    ("log-softmax", "aclnnLogSoftmax", [X], [((2, 3), np.float32)], {"dim": 1},
     [X - np.log(np.exp(X).sum(1, keepdims=True))]),
]  # fmt: skip


@pytest.mark.parametrize(("fn", "inputs", "outs", "attrs", "expected"),
                         [pytest.param(*c[1:], id=c[0]) for c in CASES])  # fmt: skip
def test_aclnn_function_matches_reference(fn: str, inputs: Any, outs: Any, attrs: Any, expected: Any) -> None:
    outputs = [np.full(shape, 77, dtype) for shape, dtype in outs]
    ns = operators.run(fn, inputs, outputs, attrs)
    assert ns > 0
    for out, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(out.astype(np.float64), np.asarray(want, np.float64), rtol=1e-5, atol=1e-5)


INPLACE: list[Any] = [
    ("one", "aclnnInplaceOne", [], {}, np.ones((2, 3))),
    ("zero", "aclnnInplaceZero", [], {}, np.zeros((2, 3))),
    ("fill-scalar", "aclnnInplaceFillScalar", [], {"value": 2.5}, np.full((2, 3), 2.5)),
    ("adds", "aclnnInplaceAdds", [], {"other": 1, "alpha": 1}, X + 1),
    ("mul", "aclnnInplaceMul", [Y], {}, X * Y),
    ("copy-broadcast", "aclnnInplaceCopy", [Y[0]], {}, np.stack([Y[0], Y[0]])),
    ("masked-fill", "aclnnInplaceMaskedFillScalar", [np.array([False, True, False])], {"value": -1.0},
     np.where([False, True, False], -1.0, X)),
    ("tril", "aclnnInplaceTril", [], {"diagonal": 0}, np.tril(X)),
    ("sqrt-self", "aclnnInplaceSqrt", [], {}, np.sqrt(np.abs(X))),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fn", "inputs", "attrs", "expected"), [pytest.param(*c[1:], id=c[0]) for c in INPLACE]
)
def test_inplace_functions_write_self_through_a_strided_view(
    fn: str, inputs: Any, attrs: Any, expected: Any
) -> None:
    storage = (np.abs(X) if fn == "aclnnInplaceSqrt" else X).T.copy()
    self_ref = storage.T  # (2, 3), not contiguous
    operators.run(fn, inputs, [self_ref], attrs)
    np.testing.assert_allclose(storage.T, expected, rtol=1e-6)


@pytest.mark.parametrize(
    ("fn", "inputs", "outs", "attrs", "code", "words"),
    [
        pytest.param("aclnnAdds", [X], [(2, 3)], {"alpha": 1}, ACL_ERROR_OP_ATTR_NOT_MATCH, "'other' is missing",
                     id="missing-scalar"),
        pytest.param("aclnnSoftmax", [X], [(2, 3)], {"dim": 5}, ACL_ERROR_OP_ATTR_NOT_MATCH, "dim 5", id="bad-dim"),
        pytest.param("aclnnLayerNorm", [X3, None, None], [(2, 3, 4)], {"normalizedShape": [3], "eps": 1e-5},
                     ACL_ERROR_OP_ATTR_NOT_MATCH, "normalizedShape [3]", id="layernorm-shape"),
        pytest.param("aclnnEmbedding", [X, np.array([1.0])], [(1, 3)], {}, ACL_ERROR_OP_INPUT_NOT_MATCH,
                     "integers", id="float-indices"),
        pytest.param("aclnnCat", [X, f32(2, 2)], [(4, 3)], {"dim": 0}, ACL_ERROR_OP_INPUT_NOT_MATCH,
                     "input 1 has shape [2, 2]", id="cat-shapes"),
    ],
)  # fmt: skip
def test_aclnn_bad_parameters_name_the_function_and_parameter(
    fn: str, inputs: Any, outs: Any, attrs: Any, code: int, words: str
) -> None:
    with pytest.raises(operators.OperatorError) as info:
        operators.run(fn, inputs, [np.zeros(s, np.float32) for s in outs], attrs)
    assert info.value.code == code
    assert fn in str(info.value) and words in str(info.value)


@pytest.mark.parametrize(
    ("fn", "attrs", "check"),
    [
        ("aclnnInplaceNormal", {"mean": 2.0, "std": 0.5}, lambda v: abs(v.mean() - 2) < 0.05 and abs(v.std() - 0.5) < 0.05),
        ("aclnnInplaceUniform", {"from": -1.0, "to": 3.0}, lambda v: v.min() >= -1 and v.max() < 3 and abs(v.mean() - 1) < 0.1),
    ],
)  # fmt: skip
def test_random_fills_follow_their_parameters_and_seed(fn: str, attrs: Any, check: Any) -> None:
    def draw(seed: int, offset: int) -> np.ndarray:
        out = np.zeros((100, 50), np.float32)[:, ::2]  # a strided view
        operators.run(fn, [], [out], {**attrs, "seed": seed, "offset": offset})
        return out.copy()

    first = draw(7, 0)
    assert check(first)
    np.testing.assert_array_equal(first, draw(7, 0))  # the same seed and offset: the same numbers
    assert not np.array_equal(first, draw(7, 4))  # the next offset: new ones


def test_every_case_covers_a_known_function_and_every_spec_has_a_case() -> None:
    tested = {c[1] for c in CASES} | {c[1] for c in INPLACE}
    assert tested <= frozenset(operators.KERNELS)
    core = {"aclnnInplaceOne", "aclnnAdds", "aclnnMatmul", "aclnnLayerNorm", "aclnnSoftmax", "aclnnGelu",
            "aclnnEmbedding", "aclnnCat", "aclnnSlice", "aclnnTriu", "aclnnInplaceMaskedFillScalar",
            "aclnnInplaceCopy", "aclnnCast", "aclnnArange", "aclnnReduceSum", "aclnnMean", "aclnnArgMax"}  # fmt: skip
    assert core <= tested


def test_the_c_table_has_the_python_specs_parameters() -> None:
    table = json.loads((ROOT / "libascendcl" / "api" / "aclnn_api.json").read_text())
    rows = {row["name"]: row for row in table["functions"]}
    assert set(rows) == set(aclnn.SPECS)
    for name, (params, _) in aclnn.SPECS.items():
        assert [(p["name"], p["kind"]) for p in rows[name]["params"]] == list(params), name
