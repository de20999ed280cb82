"""libascendcl.so on the host: C programs linked with -lascendcl against a real aclserver.

Each test runs ``tests/c/acl_check.c`` (one scenario per run) with FLEXNPU_CONF pointing at the
claim's client.conf, and asserts on the values the program printed as well as on its own checks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from flexnpu_testing import aclserver_harness
from tests.c.conftest import MIB, Claim, run


def test_quota_device_count_and_refusal_message(acl_check: Path, claim_factory: Callable[..., Claim]) -> None:
    quota = 256 * MIB
    claim = claim_factory(
        [aclserver_harness.share(0, die=0, memory=quota), aclserver_harness.share(1, die=1, memory=quota)],
        staging_bytes=4 * MIB,
    )
    res = run(acl_check, "quota", str(quota), "2", conf=claim.conf).ok()
    assert res.values["device_count"] == "2"
    assert int(res.values["total"]) == quota
    assert res.values["over_quota_code"] == "207001"
    assert "exceeds the memory quota" in res.values["over_quota_msg"], res.values


def test_memcpy_both_ways_plain_and_zero_copy(acl_check: Path, claim: Claim) -> None:
    run(acl_check, "memcpy", str(claim.staging), conf=claim.conf).ok()


def test_streams_kernels_and_events(acl_check: Path, claim: Claim) -> None:
    res = run(acl_check, "streams", "20000", conf=claim.conf).ok()
    assert float(res.values["elapsed_ms"]) >= 57


def test_bad_arguments_get_clear_codes_and_the_session_survives(acl_check: Path, claim: Claim) -> None:
    res = run(acl_check, "badargs", conf=claim.conf).ok()
    assert "aclmdlLoadFromFileWithQ is not supported" in res.values["unsupported_msg"]


def test_threads_share_the_one_connection(acl_check: Path, claim: Claim) -> None:
    run(acl_check, "threads", "8", conf=claim.conf).ok()


def test_tcp_endpoint_when_there_is_no_unix_socket(
    acl_check: Path, claim_factory: Callable[..., Claim]
) -> None:
    claim = claim_factory([aclserver_harness.share(0, memory=64 * MIB)], unix=False, staging_bytes=4 * MIB)
    run(acl_check, "memcpy", str(claim.staging), conf=claim.conf).ok()
