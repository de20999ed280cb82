"""What a hostile tenant can make its own aclserver hold (issue 25 classes 3, 6, 8, 9).

Real aclserver processes and real clients on the unix socket. Each test runs the attack as the
adversarial round described it and checks the tenant stays held to its share:

* 3/9: a client that keeps the sealed memfds it was passed after freeing its host buffers (and
  asks for the staging memfd again and again) holds no pages once the server let them go: the
  memfds are punched when freed, so the 640 MiB on a 128 MiB bound — and the OOM kills of the
  aclserver that followed — cannot happen.
* 6: a model whose input and output sizes differ per batch (``[-1,1024]`` -> ``[-1,4]``) is
  refused at load with an ACL error naming the field; the session, its neighbour and the quota
  are as before (``tests/unit/test_aclserver_streams.py`` shows an executor error ending its
  task with an ACL error, the worker thread alive).
* 8: the descriptions of loaded models (~150 KiB of the aclserver's memory for a 54 KiB header)
  are charged to the claim's host-memory bound: loads that take no device memory stop at the
  bound with 207001 instead of growing the aclserver until its cgroup OOM-kills it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flexnpu_client import AclError, Session
from flexnpu_runtime.aclserver import models
from flexnpu_runtime.daemon import shmfs
from flexnpu_testing import aclserver_harness
from flexnpu_wire import codes
from flexnpu_wire import modelfile as mf
from flexnpu_wire.framing import Op

MIB = 1 << 20


def _tmpfs(host: int) -> int:
    return shmfs.size_for(host_memory_bytes=host, max_sessions=16, staging_bytes=4 * MIB)


def _held_bytes(fds: list[int]) -> int:
    """Bytes of memory the memfds behind ``fds`` hold (each distinct memfd counted once)."""
    seen: dict[tuple[int, int], int] = {}
    for fd in fds:
        st = os.fstat(fd)
        seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return sum(seen.values())


def test_memfds_kept_after_free_hold_nothing_beyond_the_host_bound(tmp_path: Path) -> None:
    bound = 128 * MIB
    kept: list[int] = []
    with aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, memory=bound, host_memory=bound)],
        ledger_dir=str(tmp_path / "l"), shm_mount_bytes=_tmpfs(bound),
    ) as server, Session.open(server.conf()) as s:  # fmt: skip
        assert s.transport_kind == "unix"
        s.init()
        s.set_device(0)
        try:
            for _ in range(10):  # 10 x 64 MiB = 640 MiB passed over a 128 MiB bound
                rid, reply = s.link.request_id(Op.MALLOC_HOST_FD, (64 * MIB,))
                assert reply.ints[0] == 0, reply.tail
                fd = s.link.take_fd(rid)
                kept.append(fd)
                assert _held_bytes([fd]) == 64 * MIB, "the server allocates a host buffer up front"
                s.call(Op.FREE_HOST, reply.ints[1])
                assert _held_bytes([fd]) == 0, "a freed host buffer's memfd holds no page any more"
            assert _held_bytes(kept) <= bound
            # the staging region: asked for again and again, it is one memfd, never a new one
            for _ in range(8):
                rid, reply = s.link.request_id(Op.STAGING_FD)
                assert reply.ints[0] == 0, reply.tail
                kept.append(s.link.take_fd(rid))
            staging = kept[10:]
            assert len({os.fstat(fd).st_ino for fd in staging}) == 1
            assert _held_bytes(staging) <= server.spec.staging_bytes
            assert server.proc.poll() is None
        finally:
            held_while_open = _held_bytes(kept)
    try:
        assert held_while_open <= bound + server.spec.staging_bytes
        assert _held_bytes(kept) == 0, "the session's end reclaims its staging memfd too"
    finally:
        for fd in kept:
            os.close(fd)


def _per_batch_model() -> mf.ModelFile:
    """``[-1,1024]`` -> ``[-1,4]``: as many elements at no gear (0), not at any real one."""
    return mf.ModelFile(
        inputs=(
            mf.Tensor("x", 0, mf.FORMAT_ND, (-1, 1024)),
            mf.Tensor(mf.DYNAMIC_TENSOR_NAME, 9, mf.FORMAT_ND, (1,)),
        ),
        outputs=(mf.Output(mf.Tensor("y", 0, mf.FORMAT_ND, (-1, 4)), mf.Op.COPY, 0),),
        batch_gears=(1, 8),
    )


def test_a_model_the_executor_cannot_compute_is_refused_at_load(tmp_path: Path) -> None:
    quota = 64 * MIB
    with aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, memory=quota)], ledger_dir=str(tmp_path / "l"),
    ) as server, Session.open(server.conf()) as s, Session.open(server.conf()) as other:  # fmt: skip
        for session in (s, other):
            session.init()
            session.set_device(0)
        for _ in range(4):
            with pytest.raises(AclError) as err:
                s.load_model(mf.render_header(_per_batch_model()))  # the tenant writes the bytes itself
            assert err.value.ret == codes.ACL_ERROR_PARSE_MODEL
            assert "outputs[0].dims" in err.value.message and "every gear" in err.value.message
        assert s.get_mem_info() == (quota, quota), "a refused load keeps nothing"
        ptr = other.malloc(1 << 20)  # the session and its neighbour are served as before
        other.copy_to_device(ptr, b"ok" * 512)
        assert other.copy_from_device(ptr, 1024) == b"ok" * 512
        other.free(ptr)
        s.synchronize_device()
        assert server.proc.poll() is None


def _wide_model() -> bytes:
    """A model that takes no device memory but has a 54 KiB description (255 inputs, long names)."""
    dims = (1, 1, 1, 1, 1, 1, 1, 4)
    return mf.render(
        mf.ModelFile(
            inputs=tuple(mf.Tensor(f"i{i:05d}".ljust(127, "x"), 0, mf.FORMAT_ND, dims) for i in range(255)),
            outputs=(mf.Output(mf.Tensor("o".ljust(127, "y"), 0, mf.FORMAT_ND, dims), mf.Op.COPY, 0),),
        )
    )


def test_model_descriptions_are_charged_to_the_host_bound(tmp_path: Path) -> None:
    bound = 32 * MIB
    data = _wide_model()
    header = mf.header_bytes(data)
    with aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, memory=64 * MIB, host_memory=bound)],
        ledger_dir=str(tmp_path / "l"), shm_mount_bytes=_tmpfs(bound),
    ) as server, Session.open(server.conf()) as s:  # fmt: skip
        s.init()
        s.set_device(0)
        loaded: list[int] = []
        with pytest.raises(AclError) as err:
            for _ in range(256):  # the per-session cap would end it here without the charge
                loaded.append(s.load_model(data))
        assert err.value.ret == codes.ACL_ERROR_RT_MEMORY_ALLOCATION and "hostMemory" in err.value.message
        each = models.DESC_COST_FIXED + models.DESC_COST_PER_HEADER_BYTE * header
        assert len(loaded) == bound // each - 1 or len(loaded) == bound // each, (len(loaded), each)
        assert s.get_mem_info() == (64 * MIB, 64 * MIB), "the models took no device memory"
        for mid in loaded[:10]:
            s.unload_model(mid)
        s.load_model(data)  # an unload gives its description's charge back
        assert server.proc.poll() is None
