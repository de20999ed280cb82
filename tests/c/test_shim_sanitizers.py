"""The C client's scenarios again, with libascendcl.so and the program built with AddressSanitizer,
LeakSanitizer and UndefinedBehaviorSanitizer: any memory error, leak or undefined behaviour fails
the run (and so the test), not only a wrong result."""

from __future__ import annotations

import functools
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from flexnpu_testing import aclserver_harness, clibrary
from tests.c.conftest import HERE, MIB, Claim, run

SCENARIOS = [
    pytest.param(("quota", str(256 * MIB), "2"), id="quota"),
    pytest.param(("memcpy", str(4 * MIB)), id="memcpy"),
    pytest.param(("streams", "2000"), id="streams"),
    pytest.param(("badargs",), id="badargs"),
    pytest.param(("threads", "8"), id="threads"),
    pytest.param(("fork",), id="fork"),
    pytest.param(("forkbusy", "300000"), id="forkbusy"),
    pytest.param(("acl_semantics.c", "preinit", "2"), id="semantics-preinit"),
    pytest.param(("acl_semantics.c", "lasterror"), id="semantics-lasterror"),
    pytest.param(("acl_semantics.c", "memory", str(256 * MIB), "2"), id="semantics-memory"),
    pytest.param(("acl_semantics.c", "peer"), id="semantics-peer"),
    pytest.param(("acl_semantics.c", "waits", "2000000"), id="semantics-waits"),
]


@functools.cache
def _sanitized(source: str) -> Path:
    """tests/c/<source> built with the sanitizers and linked to the sanitized library."""
    lib = clibrary.build_library(sanitized=True)
    return clibrary.compile_program(
        HERE / source, link_library=lib, extra_flags=[*clibrary.SANITIZERS, "-g"], out_dir=lib.parent
    )


@pytest.fixture(scope="module")
def sanitized_check() -> Path:
    return _sanitized("acl_check.c")


@pytest.mark.parametrize("args", SCENARIOS)
def test_scenario_is_sanitizer_clean(claim_factory: Callable[..., Claim], args: tuple[str, ...]) -> None:
    """Each scenario of acl_check.c (the first argument names another program when it ends in .c)."""
    source, args = (args[0], args[1:]) if args[0].endswith(".c") else ("acl_check.c", args)
    claim = claim_factory(
        [
            aclserver_harness.share(0, die=0, memory=256 * MIB),
            aclserver_harness.share(1, die=1, memory=256 * MIB),
        ],
        staging_bytes=4 * MIB,
    )
    env = {"ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
    res = run(_sanitized(source), *args, conf=claim.conf, **env)
    assert "ERROR: AddressSanitizer" not in res.stderr and "runtime error:" not in res.stderr, res.stderr[
        -4000:
    ]
    assert "LeakSanitizer" not in res.stderr, res.stderr[-4000:]
    res.ok()


def test_refusals_are_sanitizer_clean(sanitized_check: Path, claim_factory: Callable[..., Claim]) -> None:
    """A full aclserver's Op.NONE refusal and a server killed mid-session, under the sanitizers."""
    claim = claim_factory([aclserver_harness.share(0, memory=64 * MIB)], max_sessions=1, max_connections=2)
    env = {"ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
    holders = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
    try:
        for s in holders:
            s.connect(claim.server.spec.unix_socket)
        res = run(sanitized_check, "init", conf=claim.conf, **env)
        assert res.values["init_code"] == "207005" and "AddressSanitizer" not in res.stderr, res.stderr[
            -4000:
        ]
    finally:
        for s in holders:
            s.close()
    other = claim_factory([aclserver_harness.share(0, memory=64 * MIB)])
    other.server.stop(signal.SIGKILL)
    res = run(sanitized_check, "init", conf=other.conf, **env)
    assert res.values["init_code"] == "500000" and "Sanitizer" not in res.stderr, res.stderr[-4000:]


@pytest.fixture(scope="module")
def tsan_check() -> Path:
    lib = clibrary.build_library(thread_sanitized=True)
    return clibrary.compile_program(
        HERE / "acl_check.c",
        link_library=lib,
        extra_flags=[*clibrary.THREAD_SANITIZER, "-g"],
        out_dir=lib.parent,
    )


@pytest.mark.parametrize(
    "args",
    [pytest.param(("threads", "8"), id="threads"), pytest.param(("forkbusy", "300000"), id="forkbusy")],
)
def test_threads_are_thread_sanitizer_clean(
    tsan_check: Path, claim_factory: Callable[..., Claim], args: tuple[str, ...]
) -> None:
    """Eight threads copying through the one connection, and a fork while a thread is in a call,
    under ThreadSanitizer: no data race is reported."""
    claim = claim_factory([aclserver_harness.share(0, memory=256 * MIB)], staging_bytes=4 * MIB)
    res = run(tsan_check, *args, conf=claim.conf, TSAN_OPTIONS="halt_on_error=1")
    assert "ThreadSanitizer" not in res.stderr, res.stderr[-4000:]
    res.ok()
