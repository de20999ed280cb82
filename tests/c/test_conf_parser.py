"""libascendcl's client.conf reader (libascendcl/src/conf.c) under AddressSanitizer and
UndefinedBehaviorSanitizer: the valid file is read, every truncation and thousands of seeded
mutations are refused or read without a memory error, each case from an exact-size buffer."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from flexnpu_testing import clibrary
from tests.c.conftest import HERE

SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]
VALID = {
    "version": 1,
    "claim_uid": "0d7e4b2c-1111-2222-3333-444455556666",
    "token": "ab" * 16,
    "endpoints": {"unix": "/dev/shm/flexnpu/aclserver.sock", "tcp": "[fd00::1]:45678"},
    "shm_dir": "/dev/shm/flexnpu",
    "soc_name": "Ascend910B4",
    "shares": [
        {"virtual_id": 1, "memory_bytes": 1 << 30, "compute_percent": 30, "policy": "fixed"},
        {"virtual_id": 0, "memory_bytes": 1 << 30, "compute_percent": 30, "policy": "fixed"},
    ],
}


@pytest.fixture(scope="module")
def driver() -> Path:
    src = clibrary.LIBRARY_DIR / "src"
    flags = [*SANITIZE, f"-I{src}", f"-I{clibrary.LIBRARY_DIR / 'include'}", str(src / "conf.c")]
    return clibrary.compile_program(HERE / "conf_driver.c", include_acl_headers=False, extra_flags=flags)


def _run(driver: Path, cases: list[bytes], tmp_path: Path) -> list[str]:
    data = tmp_path / "cases"
    data.write_bytes(b"\xff".join(cases))
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
    res = subprocess.run([str(driver), str(data)], capture_output=True, timeout=120, env=env, check=False)
    assert res.returncode == 0, res.stderr.decode(errors="replace")[-4000:]
    lines = res.stdout.decode(errors="replace").splitlines()
    assert len(lines) == len(cases)
    return lines


def test_valid_escaped_and_every_truncation(driver: Path, tmp_path: Path) -> None:
    text = json.dumps(VALID, indent=1).encode()
    escaped = json.dumps(VALID, ensure_ascii=True).replace('"fixed"', '"\\u0066ixed"').encode()
    cases = [text, escaped, *(text[:i] for i in range(len(text)))]
    out = _run(driver, cases, tmp_path)
    assert out[0] == f"0 {VALID['claim_uid']}" and out[1] == f"0 {VALID['claim_uid']}"
    assert all(not line.startswith("0 ") for line in out[2:]), [
        c for c, o in zip(cases, out, strict=True) if o.startswith("0 ")
    ]


def test_seeded_mutations_never_break_memory(driver: Path, tmp_path: Path) -> None:
    rng = random.Random(1109)
    base = json.dumps(VALID).encode()
    alphabet = b'{}[]",:\\0123456789eE+-.tfnul \t\n\x00\x7f\xc3\xa9u'
    cases = []
    for _ in range(3000):
        b = bytearray(base)
        for _ in range(rng.randint(1, 6)):
            op = rng.randrange(3)
            pos = rng.randrange(len(b) + 1)
            if op == 0 and b:
                del b[min(pos, len(b) - 1)]
            elif op == 1:
                b.insert(pos, rng.choice(alphabet))
            elif b:
                b[min(pos, len(b) - 1)] = rng.choice(alphabet)
        cases.append(bytes(b).replace(b"\xff", b""))
    cases += [
        b"[" * 5000,
        b'{"a":' * 5000,
        b'"\\ud800\\udc00"',
        b"1" * 400,
        b"-0.5e-400",
        b'"' + b"x" * 100000 + b'"',
    ]
    out = _run(driver, cases, tmp_path)
    accepted = sum(line.startswith("0 ") for line in out)
    assert 0 < accepted < len(cases)  # the mutations are varied: some still valid, most not
