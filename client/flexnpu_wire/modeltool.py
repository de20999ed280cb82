"""``python -m flexnpu_wire.modeltool``: write and describe models of FlexNPU's emulated format.

Usage::

    python -m flexnpu_wire.modeltool write model.fnm --spec model.json
    python -m flexnpu_wire.modeltool describe model.fnm      # the header as JSON

The spec (JSON; ``docs/model-format.md`` has a full example)::

    {"inputs":  [{"name": "x", "data_type": "float32", "format": "NCHW", "dims": [1, 3, 4, 4]}],
     "outputs": [{"name": "y", "data_type": "float32", "dims": [1, 3, 4, 4],
                  "op": "affine", "a": 0, "scale": 2.0, "bias": 1.0}],
     "weight_bytes": 4096, "weights_fill": 0, "work_bytes": 1048576,
     "cost_us": 1000, "cost_ns_per_element": 0, "batch_gears": [1, 2, 4]}

``weights_file`` (a path, relative to the spec) or ``weights_fill`` (a byte) gives the weights.
With ``batch_gears`` or ``hw_gears`` the dynamic-shape input (``ascend_mbatch_shape_data``) is
appended to the inputs unless the spec names it. Exit codes: 0 done, 2 a bad spec or model
file (the message names the field).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flexnpu_wire import modelfile
from flexnpu_wire.modelfile import ModelFile, ModelFormatError, Op, Output, Tensor

__all__ = ["DATA_TYPES", "FORMATS", "describe", "from_spec", "main"]

DATA_TYPES = {
    "float32": 0, "float": 0, "float16": 1, "int8": 2, "int32": 3, "uint8": 4, "int16": 6,
    "uint16": 7, "uint32": 8, "int64": 9, "uint64": 10, "float64": 11, "double": 11, "bool": 12,
}  # fmt: skip
"""Names of the aclDataType values the format computes with."""
FORMATS = {"NCHW": modelfile.FORMAT_NCHW, "NHWC": modelfile.FORMAT_NHWC, "ND": modelfile.FORMAT_ND}
_SPEC_KEYS = {
    "inputs", "outputs", "weight_bytes", "weights_fill", "weights_file", "work_bytes", "cost_us",
    "cost_ns_per_element", "batch_gears", "hw_gears",
}  # fmt: skip


def from_spec(spec: dict[str, Any], *, base: Path = Path()) -> ModelFile:
    """The model a spec document describes (ModelFormatError naming the field)."""
    unknown = sorted(set(spec) - _SPEC_KEYS)
    if unknown:
        raise ModelFormatError(unknown[0], f"unknown spec field (known: {', '.join(sorted(_SPEC_KEYS))})")
    inputs = [_tensor(t, f"inputs[{i}]") for i, t in enumerate(_list(spec, "inputs"))]
    outputs = [_output(o, f"outputs[{i}]") for i, o in enumerate(_list(spec, "outputs"))]
    batch = tuple(_int(g, "batch_gears") for g in spec.get("batch_gears", []))
    hw = tuple((_int(g[0], "hw_gears"), _int(g[1], "hw_gears")) for g in spec.get("hw_gears", []))
    if (batch or hw) and not any(t.name == modelfile.DYNAMIC_TENSOR_NAME for t in inputs):
        inputs.append(Tensor(modelfile.DYNAMIC_TENSOR_NAME, 9, modelfile.FORMAT_ND, (1 if batch else 2,)))
    weight_bytes = _int(spec.get("weight_bytes", 0), "weight_bytes")
    if "weights_file" in spec:
        weights = (base / str(spec["weights_file"])).read_bytes()
    else:
        weights = bytes([_int(spec.get("weights_fill", 0), "weights_fill") & 0xFF]) * weight_bytes
    model = ModelFile(
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        weight_bytes=weight_bytes,
        work_bytes=_int(spec.get("work_bytes", 0), "work_bytes"),
        cost_us=_int(spec.get("cost_us", 0), "cost_us"),
        cost_ns_per_element=_int(spec.get("cost_ns_per_element", 0), "cost_ns_per_element"),
        batch_gears=batch,
        hw_gears=hw,
        weights=weights,
    )
    modelfile.check(model)
    return model


def describe(model: ModelFile) -> dict[str, Any]:
    """A JSON-ready description of a model's header (what ``describe`` prints)."""
    names = {v: k for k, v in reversed(DATA_TYPES.items())}
    formats = {v: k for k, v in FORMATS.items()}

    def tensor(t: Tensor) -> dict[str, Any]:
        return {"name": t.name, "data_type": names.get(t.data_type, t.data_type),
                "format": formats.get(t.format, t.format), "dims": list(t.dims)}  # fmt: skip

    return {
        "inputs": [{**tensor(t), "size": model.input_size(i)} for i, t in enumerate(model.inputs)],
        "outputs": [
            {
                **tensor(o.tensor),
                "size": model.output_size(i),
                "op": o.op.name.lower(),
                "a": o.a,
                "b": o.b,
                "scale": o.scale,
                "bias": o.bias,
            }
            for i, o in enumerate(model.outputs)
        ],
        "weight_bytes": model.weight_bytes,
        "work_bytes": model.work_bytes,
        "cost_us": model.cost_us,
        "cost_ns_per_element": model.cost_ns_per_element,
        "batch_gears": list(model.batch_gears),
        "hw_gears": [list(g) for g in model.hw_gears],
    }


def _list(spec: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = spec.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ModelFormatError(key, "must be a list of objects")
    return value


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelFormatError(where, f"must be a whole number >= 0, got {value!r}")
    return value


def _tensor(doc: dict[str, Any], where: str) -> Tensor:
    dtype = doc.get("data_type", "float32")
    fmt = doc.get("format", "ND")
    dims = doc.get("dims", [])
    if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise ModelFormatError(f"{where}.dims", "must be a list of integers (-1: dynamic)")
    return Tensor(
        name=str(doc.get("name", "")),
        data_type=DATA_TYPES[dtype]
        if dtype in DATA_TYPES
        else _enum(dtype, f"{where}.data_type", DATA_TYPES),
        format=FORMATS[fmt] if fmt in FORMATS else _enum(fmt, f"{where}.format", FORMATS),
        dims=tuple(dims),
    )


def _enum(value: object, where: str, names: dict[str, int]) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ModelFormatError(where, f"unknown value {value!r} (one of {', '.join(names)}, or a number)")


def _output(doc: dict[str, Any], where: str) -> Output:
    op = str(doc.get("op", "copy")).upper()
    if op not in Op.__members__:
        raise ModelFormatError(
            f"{where}.op",
            f"unknown op {doc.get('op')!r} (one of {', '.join(o.lower() for o in Op.__members__)})",
        )
    rest = {k: v for k, v in doc.items() if k not in ("op", "a", "b", "scale", "bias")}
    return Output(
        tensor=_tensor(rest, where),
        op=Op[op],
        a=_int(doc.get("a", 0), f"{where}.a"),
        b=_int(doc.get("b", 0), f"{where}.b"),
        scale=float(doc.get("scale", 1.0)),
        bias=float(doc.get("bias", 0.0)),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flexnpu_wire.modeltool", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write", help="write a model file from a JSON spec")
    write.add_argument("out", help="the model file to write")
    write.add_argument("--spec", required=True, help="the JSON spec ('-' reads stdin)")
    show = sub.add_parser("describe", help="print a model file's header as JSON")
    show.add_argument("model", help="a model file")
    args = parser.parse_args(argv)
    try:
        if args.command == "write":
            text = sys.stdin.read() if args.spec == "-" else Path(args.spec).read_text()
            base = Path(".") if args.spec == "-" else Path(args.spec).parent
            doc = json.loads(text)
            if not isinstance(doc, dict):
                raise ModelFormatError("spec", "must be a JSON object")
            Path(args.out).write_bytes(modelfile.render(from_spec(doc, base=base)))
        else:
            print(json.dumps(describe(modelfile.parse(Path(args.model).read_bytes())), indent=2))
    except (ModelFormatError, ValueError, OSError) as exc:
        print(f"modeltool: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
