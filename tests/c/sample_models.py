"""Models of FlexNPU's emulated format for the C model tests and benchmarks (written to files).

``classifier`` is the model ``tests/c/samples/model_inference.cpp`` expects: input 0 float32
(NCHW), output 0 = input * 2 + 1, output 1 = input + the weights (float32 0.5 each).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from flexnpu_wire import modelfile as mf

__all__ = ["WEIGHT", "classifier", "expected_out1_sum", "write"]

WEIGHT = 0.5


def classifier(
    dims: tuple[int, ...] = (1, 3, 16, 16),
    *,
    cost_us: int = 0,
    work_bytes: int = 1 << 20,
    weight_elems: int = 64,
) -> mf.ModelFile:
    x = mf.Tensor("image", 0, mf.FORMAT_NCHW, dims)
    return mf.ModelFile(
        inputs=(x,),
        outputs=(
            mf.Output(mf.Tensor("scores", 0, mf.FORMAT_ND, dims), mf.Op.AFFINE, 0, 0, 2.0, 1.0),
            mf.Output(mf.Tensor("biased", 0, mf.FORMAT_ND, dims), mf.Op.ADD_WEIGHTS, 0),
        ),
        weight_bytes=4 * weight_elems,
        work_bytes=work_bytes,
        cost_us=cost_us,
        weights=struct.pack(f"<{weight_elems}f", *([WEIGHT] * weight_elems)),
    )


def expected_out1_sum(model: mf.ModelFile, iteration: int) -> float:
    """Output 1's sum after the program's execution number ``iteration`` (0-based)."""
    n = model.inputs[0].elements()
    x = (np.arange(n) % 97).astype(np.float32) * np.float32(0.25) + np.float32(iteration)
    return float(np.sum((x + np.float32(WEIGHT)).astype(np.float32), dtype=np.float64))


def write(path: Path, model: mf.ModelFile) -> Path:
    path.write_bytes(mf.render(model))
    return path
