"""The OPERATOR message's tail (client/flexnpu_wire/opcall.py): what the C client writes decodes to the same
operator, and each malformed field is refused naming it."""

from __future__ import annotations

import struct

import pytest

from flexnpu_testing import opcall_writer
from flexnpu_wire import opcall
from flexnpu_wire.errors import ContractError
from flexnpu_wire.opcall import AttrKind, Placement, Tensor

X = Tensor(Placement.DEVICE, dtype=0, dims=(2, 3), strides=(3, 1), offset=0, address=0x1000, storage_bytes=24)
S = Tensor(Placement.HOST, dtype=0, dims=(), data=struct.pack("<f", 1.5))
ATTRS = [
    ("transpose_x2", AttrKind.BOOL, True),
    ("axis", AttrKind.INT, -1),
    ("epsilon", AttrKind.FLOAT, 1e-5),
    ("mode", AttrKind.STRING, "exact"),
    ("axes", AttrKind.LIST_INT, [0, 2]),
    ("scales", AttrKind.LIST_FLOAT, [0.5, 2.0]),
    ("names", AttrKind.LIST_STRING, ["a", "bc"]),
    ("shapes", AttrKind.LIST_LIST_INT, [[1, 2], [], [3]]),
]


def test_round_trip() -> None:
    tail = opcall_writer.encode("MatMul", [X, S, Tensor(Placement.ABSENT)], [X], ATTRS)
    call = opcall.decode(tail, 3, 1, len(ATTRS))
    assert call.name == "MatMul"
    assert call.inputs == (X, S, Tensor(Placement.ABSENT)) and call.outputs == (X,)
    assert call.attrs == {k: v for k, _, v in ATTRS}


@pytest.mark.parametrize(
    ("tail", "n_in", "field"),
    [
        pytest.param(b"", 1, "name length", id="empty"),
        pytest.param(
            opcall_writer.encode("Add", [X], [X])[:-8], 1, "Add: outputs[0].storage_bytes", id="truncated"
        ),
        pytest.param(opcall_writer.encode("Add", [X], [X]) + b"\0" * 8, 1, "tail", id="trailing-bytes"),
        pytest.param(opcall_writer.encode("Add", [X], [X]), 65, "n_inputs", id="too-many-inputs"),
        pytest.param(struct.pack(">q", 0), 0, "name", id="no-name"),
        pytest.param(
            opcall_writer.encode("Add", [], []) + struct.pack(">q", 7),
            1,
            "Add: inputs[0].placement",
            id="bad-placement",
        ),
        pytest.param(
            opcall_writer.encode("Add", [], []) + struct.pack(">qqqq", 1, 0, 2, 17),
            1,
            "Add: inputs[0].ndim",
            id="too-many-dims",
        ),
    ],
)
def test_malformed_fields_are_named(tail: bytes, n_in: int, field: str) -> None:
    with pytest.raises(ContractError) as err:
        opcall.decode(tail, n_in, 0 if field in ("n_inputs",) else 1, 0)
    assert err.value.field is not None and err.value.field.startswith(field), (
        err.value.field,
        str(err.value),
    )
