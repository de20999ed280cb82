"""FlexNPU's emulated model format (client/flexnpu_wire/modelfile.py) and its writer (modeltool.py)."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from flexnpu_runtime.aclserver import model_exec
from flexnpu_wire import modelfile as mf
from flexnpu_wire import modeltool

X = mf.Tensor("x", 0, mf.FORMAT_NCHW, (1, 3, 2, 2))
Y = mf.Output(mf.Tensor("y", 0, mf.FORMAT_ND, (1, 3, 2, 2)), mf.Op.AFFINE, 0, 0, 0.5, -1.0)
MODEL = mf.ModelFile(inputs=(X,), outputs=(Y,), weight_bytes=12, work_bytes=1 << 20, cost_us=250,
                     cost_ns_per_element=1500, weights=b"w" * 12)  # fmt: skip


def test_round_trip_and_layout() -> None:
    data = mf.render(MODEL)
    assert data[:8] == mf.MAGIC
    size = mf.header_bytes(data)
    assert size % mf.HEADER_ALIGN == 0 and len(data) == size + 12
    assert mf.parse(data) == MODEL
    assert mf.parse_header(data[:size]) == replace(MODEL, weights=b"")
    assert MODEL.input_size(0) == 48 and MODEL.cost_of(12) == 250 + 18


def _header_with(**fixed: int) -> bytes:
    data = bytearray(mf.render(MODEL))
    offsets = {"version": 8, "header_bytes": 12, "n_outputs": 44, "n_batch_gears": 48}
    for name, value in fixed.items():
        struct.pack_into("<I", data, offsets[name], value)
    return bytes(data)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        pytest.param(b"short", "header", id="too-short"),
        pytest.param(b"NOTAMODEL" + bytes(100), "magic", id="magic"),
        pytest.param(_header_with(version=2), "version", id="version"),
        pytest.param(_header_with(header_bytes=100), "header_bytes", id="header-not-aligned"),
        pytest.param(_header_with(n_outputs=0), "n_outputs", id="no-outputs"),
        pytest.param(_header_with(n_outputs=9), "outputs[1].name", id="runs-past-the-header"),
        pytest.param(_header_with(n_batch_gears=500), "n_batch_gears", id="too-many-gears"),
        pytest.param(mf.render(MODEL)[:-1], "weight_bytes", id="weights-truncated"),
    ],
)
def test_bad_files_name_the_field(data: bytes, field: str) -> None:
    with pytest.raises(mf.ModelFormatError) as err:
        mf.parse(data)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("model", "field"),
    [
        pytest.param(replace(MODEL, inputs=(replace(X, data_type=27),)), "inputs[0].data_type", id="bf16-unsupported"),
        pytest.param(replace(MODEL, inputs=(replace(X, dims=(0, 3)),)), "inputs[0].dims", id="zero-dim"),
        pytest.param(replace(MODEL, outputs=(replace(Y, a=3),)), "outputs[0].a", id="no-such-input"),
        pytest.param(replace(MODEL, outputs=(replace(Y, tensor=replace(Y.tensor, dims=(5,))),)), "outputs[0].dims",
                     id="element-count-differs"),
        pytest.param(replace(MODEL, inputs=(replace(X, dims=(-1, 3)),)), "inputs[0].dims", id="dynamic-without-gears"),
        pytest.param(replace(MODEL, batch_gears=(1, 2)), "inputs[0].name", id="gears-without-dynamic-input"),
        pytest.param(replace(MODEL, outputs=(replace(Y, op=mf.Op.ADD_WEIGHTS),), weight_bytes=0, weights=b""),
                     "outputs[0].op", id="add-weights-without-weights"),
        pytest.param(replace(MODEL, outputs=(replace(Y, scale=float("nan")),)), "outputs[0].scale", id="nan-scale"),
        pytest.param(replace(MODEL, outputs=(replace(Y, tensor=replace(Y.tensor, name="x")),)), "inputs",
                     id="duplicate-names"),
    ],
)  # fmt: skip
def test_models_the_emulated_backend_could_not_execute_are_refused(model: mf.ModelFile, field: str) -> None:
    with pytest.raises(mf.ModelFormatError) as err:
        mf.render(model)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("dtype", "values", "expected"),
    [
        pytest.param(3, [1.5, -1.5, 3e10], [1, -1, 2**31 - 1], id="int32-truncates-and-clamps"),
        pytest.param(4, [-3.0, 300.0, 7.9], [0, 255, 7], id="uint8-clamps"),
        pytest.param(12, [0.0, 2.0, -0.5], [False, True, True], id="bool"),
        pytest.param(1, [0.5, 1024.0, -2.0], [0.5, 1024.0, -2.0], id="float16"),
    ],
)
def test_conversion_to_the_output_type(dtype: int, values: list[float], expected: list[object]) -> None:
    x = mf.Tensor("x", 11, mf.FORMAT_ND, (3,))
    model = mf.ModelFile(inputs=(x,), outputs=(mf.Output(mf.Tensor("y", dtype, mf.FORMAT_ND, (3,))),))
    out = bytearray(3 * mf.DTYPE_SIZES[dtype])
    model_exec.run(model, [memoryview(np.array(values, "<f8").tobytes())], [memoryview(out)], None)
    assert np.frombuffer(out, model_exec.NUMPY_TYPES[dtype]).tolist() == expected


def test_the_tool_writes_and_describes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = {
        "inputs": [{"name": "image", "data_type": "uint8", "format": "NHWC", "dims": [-1, 4, 4, 3]}],
        "outputs": [{"name": "scores", "data_type": "float32", "dims": [-1, 4, 4, 3], "op": "affine", "scale": 0.5}],
        "weight_bytes": 64, "weights_fill": 7, "cost_us": 1000, "batch_gears": [1, 8],
    }  # fmt: skip
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "m.fnm"
    assert modeltool.main(["write", str(out), "--spec", str(tmp_path / "spec.json")]) == 0
    model = mf.parse(out.read_bytes())
    assert model.weights == b"\x07" * 64 and model.inputs[-1].name == mf.DYNAMIC_TENSOR_NAME
    assert modeltool.main(["describe", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["inputs"][0]["size"] == 8 * 48 and doc["outputs"][0]["size"] == 8 * 48 * 4
    (tmp_path / "bad.json").write_text(json.dumps({**spec, "outputs": [{"name": "y", "op": "softmax"}]}))
    assert modeltool.main(["write", str(out), "--spec", str(tmp_path / "bad.json")]) == 2
    assert "outputs[0].op" in capsys.readouterr().err
