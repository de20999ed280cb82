"""The OOM/heal loop of a tenant holding its memfds no longer happens (issue 25 class 9).

A real daemon puts the aclserver in its bounded cgroup (``memory.max`` = device quota + host
limit + staging per session + overhead: 416 MiB for a 128 MiB share with 4 sessions). The
adversarial round's tenant kept the sealed memfds of freed host buffers: 640 MiB stayed charged
to that cgroup, the kernel killed the aclserver, the daemon restarted it, and again (7 kills, 5
heals in 45 s). Now a freed buffer's memfd is punched (``datalink.SealedRegion.close``): the same
tenant leaves the aclserver's cgroup with its baseline, no OOM kill, the same process.
"""

from __future__ import annotations

import os
import uuid

import pytest

from flexnpu_client import Session
from flexnpu_testing.daemon import request, share
from flexnpu_wire.clientconf import ClientConf, Endpoints, ShareInfo
from flexnpu_wire.codes import Policy
from flexnpu_wire.framing import Op
from tests.integration.conftest import MakeDaemon
from tests.integration.test_daemon_cgroups import claim_cgroups, entity

MIB = 1 << 20


@pytest.mark.root
def test_a_tenant_keeping_its_memfds_does_not_oom_its_aclserver(make_daemon: MakeDaemon) -> None:
    daemon = make_daemon(extra=("--max-sessions", "4"))
    claim = str(uuid.uuid4())
    with daemon.client() as c:
        res = c.register(request(claim, share(2, mem_gib=0.125, compute=30)))
    cg = claim_cgroups(daemon)
    memory_max = cg.figures(claim).memory_max
    assert memory_max == 416 * MIB
    conf = ClientConf(
        claim_uid=claim, token="ab" * 16, endpoints=Endpoints(unix=res.endpoints.unix_socket),
        shm_dir=res.endpoints.shm_dir, shares=(ShareInfo(0, 128 * MIB, 30, Policy.FIXED),),
    )  # fmt: skip
    kept: list[int] = []
    try:
        with Session.open(conf) as s:
            s.init()
            s.set_device(0)
            for _ in range(10):  # 640 MiB passed, each freed, every memfd kept
                rid, reply = s.link.request_id(Op.MALLOC_HOST_FD, (64 * MIB,))
                assert reply.ints[0] == 0, reply.tail
                kept.append(s.link.take_fd(rid))
                s.call(Op.FREE_HOST, reply.ints[1])
            fig = cg.figures(claim)
            assert fig.oom_kills == 0
            assert fig.memory_current < 128 * MIB, f"{fig.memory_current >> 20} MiB still charged"
            ptr = s.malloc(1 << 20)  # the session it has is the one it had: served as before
            s.free(ptr)
        info = entity(daemon, claim)
        assert (info.pid, info.restarts) == (res.pid, 0)
    finally:
        for fd in kept:
            os.close(fd)
        with daemon.client() as c:
            c.unregister(claim)
