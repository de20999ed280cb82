"""Single operators through libascendcl.so against a real aclserver (issue 24 item 3): one OPERATOR
message per aclopCompileAndExecute / fx_op_launch, computed in stream order on the share, failures
returned by the stream's next synchronize (naming the op), strided views, host scalars by value."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from flexnpu_runtime.aclserver.streams import MAX_QUEUED_TASKS
from flexnpu_testing import aclserver_harness, clibrary
from tests.c.conftest import HERE, MIB, Claim, run


@pytest.fixture(scope="module")
def op_launch(library: Path) -> Path:
    return clibrary.compile_program(HERE / "op_launch.c", link_library=library)


def test_operators_run_on_the_share_in_stream_order(op_launch: Path, claim: Claim) -> None:
    res = run(op_launch, conf=claim.conf).ok()
    assert res.values["unknown_code"] == "100024"


def test_more_operators_than_the_queue_holds_all_run(
    op_launch: Path, claim_factory: Callable[..., Claim]
) -> None:
    """On a 5 % share the die drains slowly: the launches beyond the aclserver's queue bound wait for room
    (the client's sends are held back) instead of failing, and every operator runs once, in order."""
    claim = claim_factory([aclserver_harness.share(0, memory=64 * MIB, compute=5)], staging_bytes=1 * MIB)
    n = MAX_QUEUED_TASKS * 3
    res = run(op_launch, "flood", str(n), conf=claim.conf, timeout=120).ok()
    assert res.values["flood_sum"] == str(n)
