"""``Telemetry(wait_for_port=True)``: a port held by a rolling update's old pod is bound once it is let go."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from dra_driver.errors import InvalidInput
from dra_driver.telemetry import Telemetry
from flexnpu_testing.waiting import wait_for


def test_binds_when_the_holder_lets_go() -> None:
    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    t = Telemetry(node_name="n1", driver_name="npu.flexnpu.io", metrics_port=port, metrics_host="127.0.0.1",
                  wait_for_port=True)  # fmt: skip
    try:
        t.start()  # does not raise: the old instance still holds the port
        assert t.port is None
        busy.close()
        wait_for(lambda: t.port == port, what="the port bound after its holder exited", timeout=15)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert "flexnpu_dra_prepare_requests_total" in text
    finally:
        busy.close()
        t.shutdown()


def test_other_bind_errors_still_fail() -> None:
    # Not "in use": an address this host does not have.
    t = Telemetry(node_name="n1", driver_name="npu.flexnpu.io", metrics_port=1, metrics_host="192.0.2.1",
                  wait_for_port=True)  # fmt: skip
    try:
        with pytest.raises(InvalidInput):
            t.start()
    finally:
        t.shutdown()
