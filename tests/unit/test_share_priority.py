"""A share's priority travels in the share record: the daemon API message and the stored record."""

from __future__ import annotations

import pytest

from dra_driver.daemon_api import wire
from flexnpu_wire.codes import Priority
from flexnpu_wire.shares import Share


@pytest.mark.parametrize("priority", [p.value for p in Priority])
def test_the_daemon_api_carries_the_priority(priority: str) -> None:
    share = Share(0, 3, 1 << 30, 30, "elastic", priority=priority)
    assert wire.share_from_pb(wire.share_to_pb(share)) == share


def test_a_record_from_before_priorities_reads_as_normal() -> None:
    old = Share(0, 3, 1 << 30, 30, "elastic").to_dict()
    assert "priority" not in old, "normal is not written: an older node reads the record as before"
    assert Share.from_dict(old).priority_enum is Priority.NORMAL
    assert (
        wire.share_from_pb(wire.share_to_pb(Share(0, 3, 1 << 30, 30, "elastic", priority=""))).priority
        == "normal"
    )
    lc = Share(0, 3, 1 << 30, 30, "elastic", priority="latency-critical")
    assert Share.from_dict(lc.to_dict()) == lc


def test_an_unknown_priority_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="urgent"):
        _ = Share(0, 3, 1 << 30, 30, "elastic", priority="urgent").priority_enum
