"""Single operators through libascendcl.so against a real aclserver (issue 24 item 3): one OPERATOR
message per aclopCompileAndExecute / fx_op_launch, computed in stream order on the share, failures
returned by the stream's next synchronize (naming the op), strided views, host scalars by value."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexnpu_testing import clibrary
from tests.c.conftest import HERE, Claim, run


@pytest.fixture(scope="module")
def op_launch(library: Path) -> Path:
    return clibrary.compile_program(HERE / "op_launch.c", link_library=library)


def test_operators_run_on_the_share_in_stream_order(op_launch: Path, claim: Claim) -> None:
    res = run(op_launch, conf=claim.conf).ok()
    assert res.values["unknown_code"] == "100024"
