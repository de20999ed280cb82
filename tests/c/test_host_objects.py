"""The host-side objects of libascendcl.so (issue 19 item 2): data buffers, datasets, tensor
descriptors, operator attributes, aclDataTypeSize, aclFloat16 and aclAppLog, served in the client
with no aclserver and no aclInit. The objects run under AddressSanitizer, LeakSanitizer and
UndefinedBehaviorSanitizer too; the float16 conversions are checked on all 65,536 halves."""

from __future__ import annotations

import itertools
import math
import os
import re
import struct
import subprocess
from pathlib import Path

import pytest

from flexnpu_testing import clibrary
from tests.c.conftest import HERE, run


@pytest.fixture(scope="module")
def host_objects(library: Path) -> Path:
    return clibrary.compile_program(HERE / "host_objects.c", link_library=library)


def test_every_host_object_call_and_its_refusals(host_objects: Path) -> None:
    run(host_objects, "objects", conf=None).ok()


def test_host_objects_are_sanitizer_clean() -> None:
    lib = clibrary.build_library(sanitized=True)
    exe = clibrary.compile_program(
        HERE / "host_objects.c",
        link_library=lib,
        extra_flags=[*clibrary.SANITIZERS, "-g"],
        out_dir=lib.parent,
    )
    res = run(exe, "objects", conf=None, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0")
    assert res.rc == 0 and not res.failures, res.stdout[-3000:] + res.stderr[-3000:]
    assert "ERROR: " not in res.stderr and "runtime error" not in res.stderr, res.stderr[-3000:]


# -- aclFloat16 -----------------------------------------------------------------------------------

MAX_HALF = 0x7BFF


def _half_value(h: int) -> float:
    """CANN's aclFloat16ToFloat: IEEE binary16, except that exponent 31 is an ordinary exponent."""
    sign = -1.0 if h & 0x8000 else 1.0
    exp, man = (h >> 10) & 0x1F, h & 0x3FF
    if exp == 0:
        return sign * man * 2.0**-24
    return sign * (1024 + man) * 2.0 ** (exp - 25)


def _to_f32(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


def _ieee_half(x: float) -> int:
    """IEEE binary16 round-to-nearest-even of x, saturated at +/-65504 as CANN saturates."""
    if math.isnan(x) or math.isinf(x):  # CANN has no Inf or NaN: saturated
        return MAX_HALF | (0x8000 if math.copysign(1.0, x) < 0 else 0)
    try:
        return int(struct.unpack("<H", struct.pack("<e", x))[0])
    except OverflowError:  # beyond binary16's range: CANN saturates instead of giving Inf
        return MAX_HALF | (0x8000 if x < 0 else 0)


def _convert(exe: Path, floats: list[int]) -> tuple[list[int], list[int]]:
    res = subprocess.run(
        [str(exe), "fp16"], input=struct.pack(f"<{len(floats)}I", *floats), capture_output=True, timeout=120,
        check=True,
    )  # fmt: skip
    to_float = list(struct.unpack("<65536I", res.stdout[: 4 * 65536]))
    to_half = list(struct.unpack(f"<{len(floats)}H", res.stdout[4 * 65536 :]))
    return to_float, to_half


def test_float16_to_float_on_all_65536_halves(host_objects: Path) -> None:
    to_float, _ = _convert(host_objects, [])
    want = [_to_f32(_half_value(h)) for h in range(65536)]
    assert [h for h in range(65536) if to_float[h] != want[h]] == []
    assert struct.unpack("<f", struct.pack("<I", to_float[0x7C00]))[0] == 65536.0  # CANN: no Inf
    assert struct.unpack("<f", struct.pack("<I", to_float[0x7E00]))[0] == 98304.0  # CANN: no NaN


def test_float_to_float16_rounds_to_nearest_even_on_every_half_and_between(host_objects: Path) -> None:
    """Each finite half's value, the midpoints between neighbours (ties go to even), the floats just
    above and below each midpoint, and the specials: all against IEEE binary16 rounding."""
    values = sorted({_half_value(h) for h in range(65536) if (h >> 10) & 0x1F != 0x1F})
    bits: list[int] = []
    for a, b in itertools.pairwise(values):
        mid = _to_f32((a + b) / 2)  # exact in float32: halves have 11 significant bits
        bits += [_to_f32(a), mid, mid - 1, mid + 1]  # the float32 neighbours of the midpoint too
    specials = [
        values[-1],
        65519.996,
        65520.0,
        1e30,
        -1e30,
        math.inf,
        -math.inf,
        math.nan,
        -math.nan,
        2.0**-26,
        0.0,
    ]
    bits += [_to_f32(x) for x in specials]
    floats = [struct.unpack("<f", struct.pack("<I", b))[0] for b in bits]
    _, got = _convert(host_objects, bits)
    wrong = [(x, hex(b), hex(h)) for x, b, h in zip(floats, bits, got, strict=True) if h != _ieee_half(x)]
    assert wrong == [], wrong[:20]
    assert len(floats) > 4 * 60000


# -- aclAppLog ------------------------------------------------------------------------------------

LINE = re.compile(
    r"^\[(DEBUG|INFO|WARNING|ERROR)\] APP\((\d+),([^)]*)\):\d{4}-\d\d-\d\d-\d\d:\d\d:\d\d\.\d{3}\.\d{3} "
    r"\[([^:\]]+):(\d+)\]\d+ (\w+): (.*)$"
)


@pytest.mark.parametrize(
    ("level", "shown"),
    [
        pytest.param(None, {"ERROR"}, id="default-error"),
        pytest.param("0", {"DEBUG", "INFO", "WARNING", "ERROR"}, id="debug"),
        pytest.param("2", {"WARNING", "ERROR"}, id="warning"),
        pytest.param("4", set(), id="none"),
        pytest.param("x", {"ERROR"}, id="malformed-is-default"),
    ],
)
def test_app_log_honours_the_global_log_level(host_objects: Path, level: str | None, shown: set[str]) -> None:
    env = {} if level is None else {"ASCEND_GLOBAL_LOG_LEVEL": level}
    res = subprocess.run(
        [str(host_objects), "log"], capture_output=True, text=True, timeout=60, check=True,
        env={k: v for k, v in os.environ.items() if k != "ASCEND_GLOBAL_LOG_LEVEL"} | env,
    )  # fmt: skip
    lines = res.stderr.splitlines()
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    assert {m.group(1) for m in parsed if m} == shown
    by_func = {m.group(6): m for m in parsed if m}
    assert "log_bad" not in by_func and "log_null" not in by_func
    if "DEBUG" in shown:
        debug = by_func["log_debug"]
        assert debug.group(4) == "host_objects.c" and debug.group(5) == "10" and debug.group(7) == "debug 0"
        assert int(debug.group(2)) > 0
    if "ERROR" in shown:
        assert by_func["scenario_log"].group(7) == "error 3"  # ACL_APP_LOG names the caller
        long = by_func["log_long"].group(7)
        assert len(long) == 1023 and long.endswith("...[truncated]") and long.startswith("x" * 1000)
