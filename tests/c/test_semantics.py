"""CANN's semantics of the calls libascendcl.so serves (issue 19 item 4), against real aclservers:
the device count, SoC name and run mode answer before aclInit (torch_npu asks the count first),
aclrtSetDevice before aclInit opens the session, the last-error calls return ACL_SUCCESS when
nothing failed, and every aclrtMemMallocPolicy and aclrtMemAttr value CANN defines is accepted."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from flexnpu_testing import aclserver_harness
from tests.c.conftest import MIB, Claim, run


def test_before_acl_init_the_claims_devices_and_soc_are_known(
    acl_semantics: Path, claim_factory: Callable[..., Claim]
) -> None:
    claim = claim_factory(
        [
            aclserver_harness.share(0, die=0, memory=64 * MIB),
            aclserver_harness.share(1, die=1, memory=64 * MIB),
        ],
        staging_bytes=1 * MIB,
    )
    res = run(acl_semantics, "preinit", "2", conf=claim.conf).ok()
    assert res.values["count"] == "2" and res.values["count_code"] == "0"
    assert res.values["soc"] == "FlexNPU-vNPU"  # client.conf names no SoC: the share's generic name
    conf = claim.conf.with_name("soc.conf")
    conf.write_text(json.dumps({**json.loads(claim.conf.read_text()), "soc_name": "Ascend910B4"}))
    assert run(acl_semantics, "preinit", "2", conf=conf).ok().values["soc"] == "Ascend910B4"


def test_last_error_is_success_until_a_call_fails(acl_semantics: Path, claim: Claim) -> None:
    run(acl_semantics, "lasterror", conf=claim.conf).ok()


def test_every_policy_flag_and_memory_attribute_is_accepted(
    acl_semantics: Path, claim_factory: Callable[..., Claim]
) -> None:
    quota = 64 * MIB
    claim = claim_factory(
        [aclserver_harness.share(0, die=0, memory=quota), aclserver_harness.share(1, die=1, memory=quota)],
        staging_bytes=1 * MIB,
    )
    run(acl_semantics, "memory", str(quota), "2", conf=claim.conf).ok()


def test_waits_with_a_timeout_leave_the_session_working(acl_semantics: Path, claim: Claim) -> None:
    """A 3 s kernel: aclrtStreamQuery says NOT_READY, timed synchronizes give 507046, 40 of them are
    refused past the client's limit, and calls go on while the server still owes the answers."""
    run(acl_semantics, "waits", "3000000", conf=claim.conf).ok()


def test_the_claims_devices_reach_each_other(
    acl_semantics: Path, claim_factory: Callable[..., Claim]
) -> None:
    claim = claim_factory(
        [
            aclserver_harness.share(0, die=0, memory=64 * MIB),
            aclserver_harness.share(1, die=1, memory=64 * MIB),
        ],
        staging_bytes=1 * MIB,
    )
    run(acl_semantics, "peer", conf=claim.conf).ok()
