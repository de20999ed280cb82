"""Every number the C client shares with the Python side is the same: ACL codes and enums
(flexnpu_runtime/aclserver/codes.py), the frame layout and op numbers (protocol.py), host pointers
(datalink.py), and the reply size the Python client accepts (client/transport.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from flexnpu_client import transport
from flexnpu_testing import clibrary
from flexnpu_wire import codes
from flexnpu_wire import datalink as wire_datalink
from flexnpu_wire import framing as protocol
from flexnpu_wire.framing import Op

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def c_values(library: Path) -> dict[str, int]:
    generated = clibrary.LIBRARY_DIR.parent / "client" / "flexnpu_wire" / "generated"
    exe = clibrary.compile_program(
        HERE / "print_constants.c", extra_flags=[f"-I{clibrary.LIBRARY_DIR / 'src'}", f"-I{generated}"]
    )
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True, timeout=30).stdout
    return {name: int(value) for name, value in (line.split() for line in out.splitlines())}


def python_values() -> dict[str, int]:
    values = {
        name: int(getattr(codes, name))
        for name in dir(codes)
        if name.startswith("ACL_") and isinstance(getattr(codes, name), int)
    }
    values.update({f"ACL_MEMCPY_{k.name}": int(k) for k in codes.MemcpyKind})
    mem = {"DDR_HUGE": "DDR_MEM_HUGE", "DDR_NORMAL": "DDR_MEM_NORMAL", "HBM_HUGE": "HBM_MEM_HUGE",
           "HBM_NORMAL": "HBM_MEM_NORMAL"}  # fmt: skip
    values.update({f"ACL_{mem.get(a.name, a.name)}": int(a) for a in codes.MemAttr})
    values.update({f"ACL_MEM_MALLOC_{p.name}": int(p) for p in codes.MallocPolicy})
    values.update({f"OP_{op.name}": int(op) for op in Op})
    values.update(
        {
            "FLEXNPU_PROTOCOL_VERSION": protocol.PROTOCOL_VERSION,
            "FLEXNPU_FLAG_REPLY": protocol.FLAG_REPLY,
            "FLEXNPU_HEADER_BYTES": protocol.HEADER.size,
            "FLEXNPU_MAX_INTS": 255,
            "FLEXNPU_HOST_TAG": wire_datalink.HOST_TAG,
            "FLEXNPU_OFFSET_BITS": wire_datalink.OFFSET_BITS,
            "FLEXNPU_REPLY_MAX_FRAME": transport._REPLY_MAX_FRAME,
        }
    )
    return values


def test_every_python_constant_has_the_same_value_in_c(c_values: dict[str, int]) -> None:
    expected = python_values()
    missing = sorted(set(expected) - set(c_values))
    assert not missing, f"not defined on the C side: {missing}"
    assert {k: c_values[k] for k in expected} == expected


def test_the_python_max_ints_matches_the_encoder() -> None:
    protocol.encode(Op.PING, 1, (0,) * 255)
    with pytest.raises(ValueError):
        protocol.encode(Op.PING, 1, (0,) * 256)
