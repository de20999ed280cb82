"""A claim that asked for the unix socket only gets no TCP listener (issue 25 class 1).

A real daemon and real aclservers: the register request carries ``unix_only`` (the node sets it
for ``transport: unix``); the daemon's launch spec says ``tcp_listen: false``; the aclserver
listens on its unix socket alone and reports TCP port 0, also after the daemon restarts it.
"""

from __future__ import annotations

import dataclasses
import json
import uuid

from flexnpu_testing import aclserver_harness
from tests.integration.conftest import MakeDaemon
from tests.integration.daemon_harness import hello_tcp, ping_unix, request


def test_a_unix_only_claim_gets_no_tcp_listener_and_a_tcp_one_does(make_daemon: MakeDaemon) -> None:
    daemon = make_daemon()
    unix_claim, tcp_claim = str(uuid.uuid4()), str(uuid.uuid4())
    with daemon.client() as c:
        unix_only = dataclasses.replace(request(unix_claim), unix_only=True)
        res = c.register(unix_only)
        other = c.register(request(tcp_claim))
        assert c.register(unix_only).existing, "an identical request is the same registration"
    assert res.endpoints.tcp_port == 0 and res.endpoints.unix_socket
    assert ping_unix(res.endpoints.unix_socket) == res.pid
    assert aclserver_harness.tcp_listeners(res.pid) == []
    spec = json.loads((daemon.run_dir / "aclservers" / f"{unix_claim}.spec.json").read_text())
    assert spec["tcp_listen"] is False
    # the neighbour that did not ask for unix only listens on TCP as before
    assert aclserver_harness.tcp_listeners(other.pid) == [other.endpoints.tcp_port]
    assert hello_tcp(other.endpoints.tcp_host, other.endpoints.tcp_port, "ab" * 16) == other.pid
    entries = json.loads(daemon.registry.read_text())["entries"]
    recorded = {e["request"]["claim_uid"]: e["request"].get("unix_only", False) for e in entries}
    assert recorded == {unix_claim: True, tcp_claim: False}, "a restarted daemon relaunches it the same way"
