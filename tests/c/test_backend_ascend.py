"""The aclserver's ascend backend (flexnpu_runtime/aclserver/backend_ascend.py) against an ABI-compatible
CANN emulator (tests/c/cann_emulator.c: device memory in host RAM, call counters, injected
failures). Real C calls exercise the ctypes binding, the error pass-through and the accounting;
no NPU is involved, and the backend is not verified on hardware.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexnpu_runtime.aclserver import datalink
from flexnpu_runtime.aclserver.backend import AclFailure
from flexnpu_runtime.aclserver.backend_ascend import AscendBackend
from flexnpu_testing import aclserver_harness, clibrary
from flexnpu_wire import clientconf, codes
from flexnpu_wire import datalink as wire_datalink
from tests.c.conftest import HERE, MIB, run
from tests.integration import daemon_harness
from tests.integration.daemon_harness import DaemonProc

QUOTA = 64 * MIB


@pytest.fixture(scope="module")
def emulator_build() -> Path:
    return clibrary.compile_program(
        HERE / "cann_emulator.c", include_acl_headers=False, extra_flags=["-shared", "-fPIC", "-pthread"]
    )


@pytest.fixture
def emulator(emulator_build: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy per test: each load has fresh emulator state (ctypes caches by path)."""
    monkeypatch.setenv("FLEXNPU_EMU_DEVICES", "2")
    monkeypatch.setenv("FLEXNPU_EMU_MEMORY", str(1 << 30))
    lib = tmp_path / "libascendcl.so"
    shutil.copy(emulator_build, lib)
    return lib


class Emu:
    """The emulator's test hooks, on the same loaded library the backend uses."""

    def __init__(self, path: Path) -> None:
        self.lib = ctypes.CDLL(str(path))
        self.lib.emu_calls.argtypes = [ctypes.c_char_p]
        self.lib.emu_calls.restype = ctypes.c_long
        self.lib.emu_fail_next.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self.lib.emu_allocated.restype = ctypes.c_longlong
        self.lib.emu_last_batch.restype = ctypes.c_uint64

    def calls(self, name: str) -> int:
        return int(self.lib.emu_calls(name.encode()))

    def fail_next(self, name: str, code: int) -> None:
        assert self.lib.emu_fail_next(name.encode(), code) == 0

    def allocated(self, device: int) -> int:
        return int(self.lib.emu_allocated(device))


@pytest.fixture
def backend(emulator: Path, tmp_path: Path) -> Iterator[tuple[AscendBackend, Emu]]:
    spec = aclserver_harness.make_spec(
        tmp_path,
        shares=[
            aclserver_harness.share(0, die=1, memory=QUOTA),
            aclserver_harness.share(1, die=0, memory=2 * QUOTA),
        ],
        ledger_dir=str(tmp_path / "ledger"),
    )
    b = AscendBackend(spec, library=str(emulator))
    yield b, Emu(emulator)
    b.close()


def test_quota_is_checked_before_the_runtime_is_asked(backend: tuple[AscendBackend, Emu]) -> None:
    b, emu = backend
    assert b.book.device_count() == 2 and emu.calls("aclInit") == 1
    p = b.malloc(0, QUOTA // 2, 0, owner=1)
    assert emu.allocated(1) == QUOTA // 2 and emu.allocated(0) == 0  # virtual device 0 is die 1
    assert b.mem_info(0) == (QUOTA // 2, QUOTA)
    mallocs = emu.calls("aclrtMalloc")
    with pytest.raises(AclFailure) as err:
        b.malloc(0, QUOTA // 2 + 1, 0, owner=1)
    assert err.value.code == codes.ACL_ERROR_RT_MEMORY_ALLOCATION and "quota" in err.value.message
    assert emu.calls("aclrtMalloc") == mallocs  # refused without a runtime call
    b.book.free(p, owner=1)
    assert emu.allocated(1) == 0 and b.mem_info(0) == (QUOTA, QUOTA)


def test_runtime_errors_pass_through_and_leave_no_accounting(backend: tuple[AscendBackend, Emu]) -> None:
    b, emu = backend
    emu.fail_next("aclrtMalloc", 507899)
    with pytest.raises(AclFailure) as err:
        b.malloc(1, MIB, 0)
    assert err.value.code == 507899 and "injected failure of aclrtMalloc" in err.value.message
    assert b.mem_info(1) == (2 * QUOTA, 2 * QUOTA)
    emu.fail_next("aclrtMemcpy", 107000)
    p = b.malloc(1, MIB, 0)
    with pytest.raises(AclFailure) as err:
        b.copy_to_device(p, memoryview(b"x" * 10))
    assert err.value.code == 107000


def test_the_die_really_having_less_free_memory_than_the_quota(
    emulator: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEXNPU_EMU_MEMORY", str(8 * MIB))
    spec = aclserver_harness.make_spec(
        tmp_path, shares=[aclserver_harness.share(0, memory=QUOTA)], ledger_dir=str(tmp_path / "l")
    )
    b = AscendBackend(spec, library=str(emulator))
    try:
        assert b.mem_info(0) == (8 * MIB, QUOTA)
        with pytest.raises(AclFailure) as err:
            b.malloc(0, 16 * MIB, 0)  # within the quota, beyond the die
        assert err.value.code == codes.ACL_ERROR_RT_MEMORY_ALLOCATION and "EL0004" in err.value.message
        assert b.mem_info(0) == (8 * MIB, QUOTA)
    finally:
        b.close()


def test_copies_memset_and_ranges(backend: tuple[AscendBackend, Emu]) -> None:
    b, emu = backend
    a, c = b.malloc(0, 4096, 0), b.malloc(0, 4096, 0)
    b.copy_to_device(a, memoryview(bytes(range(256)) * 16))
    out = bytearray(4096)
    b.copy_from_device(a, memoryview(out))
    assert bytes(out) == bytes(range(256)) * 16
    b.copy_on_device(c, a + 100, 1000)
    part = bytearray(1000)
    b.copy_from_device(c, memoryview(part))
    assert bytes(part) == (bytes(range(256)) * 16)[100:1100]
    b.memset(c, 0xAB, 16)
    b.copy_from_device(c, memoryview(part)[:16])
    assert bytes(part[:16]) == b"\xab" * 16
    copies = emu.calls("aclrtMemcpy")
    for bad in (
        lambda: b.copy_to_device(a + 4000, memoryview(b"y" * 200)),
        lambda: b.copy_on_device(c, a, 5000),
    ):
        with pytest.raises(AclFailure) as err:
            bad()
        assert err.value.code == codes.ACL_ERROR_INVALID_PARAM and "run past" in err.value.message
    assert emu.calls("aclrtMemcpy") == copies
    with pytest.raises(AclFailure) as err:
        b.device_view(a, 16)
    assert err.value.code == codes.ACL_ERROR_API_NOT_SUPPORT


def test_owners_and_release(backend: tuple[AscendBackend, Emu]) -> None:
    b, emu = backend
    mine, theirs = b.malloc(1, MIB, 0, owner=1), b.malloc(1, 2 * MIB, 0, owner=2)
    with pytest.raises(AclFailure):
        b.book.free(theirs, owner=1)
    b.book.release_all(owner=2)
    assert emu.allocated(0) == MIB
    b.book.free(mine, owner=1)
    assert emu.allocated(0) == 0 and emu.calls("aclrtFree") == 2


def test_each_thread_selects_its_device(backend: tuple[AscendBackend, Emu]) -> None:
    b, emu = backend
    before = emu.calls("aclrtSetDevice")
    b.mem_info(0)
    b.mem_info(0)
    assert emu.calls("aclrtSetDevice") == before + 1  # cached within a thread
    t = threading.Thread(target=lambda: b.mem_info(0))
    t.start()
    t.join()
    assert emu.calls("aclrtSetDevice") == before + 2


def test_close_frees_resets_and_finalizes(emulator: Path, tmp_path: Path) -> None:
    spec = aclserver_harness.make_spec(
        tmp_path, shares=[aclserver_harness.share(0, memory=QUOTA)], ledger_dir=str(tmp_path / "l")
    )
    b = AscendBackend(spec, library=str(emulator))
    emu = Emu(emulator)
    b.malloc(0, MIB, 0)
    b.close()
    assert emu.allocated(0) == 0
    assert emu.calls("aclrtResetDevice") == 1 and emu.calls("aclFinalize") == 1


def test_a_share_on_a_die_the_runtime_does_not_see(emulator: Path, tmp_path: Path) -> None:
    spec = aclserver_harness.make_spec(
        tmp_path, shares=[aclserver_harness.share(0, die=5)], ledger_dir=str(tmp_path / "l")
    )
    with pytest.raises(AclFailure) as err:
        AscendBackend(spec, library=str(emulator))
    assert err.value.code == codes.ACL_ERROR_INVALID_DEVICE and "die 5" in err.value.message
    assert Emu(emulator).calls("aclFinalize") == 1


def test_missing_library(tmp_path: Path) -> None:
    spec = aclserver_harness.make_spec(
        tmp_path, shares=[aclserver_harness.share(0)], ledger_dir=str(tmp_path / "l")
    )
    with pytest.raises(AclFailure) as err:
        AscendBackend(spec, library=str(tmp_path / "nope.so"))
    assert err.value.code == codes.ACL_ERROR_INTERNAL_ERROR and "nope.so" in err.value.message


def test_aclserver_process_with_the_ascend_backend(
    emulator: Path, acl_check: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C client -> aclserver (--backend ascend, via its environment twin) -> ctypes -> emulator.

    The emulated die has 48 MiB, less than the 64 MiB quota: what the client sees can only come
    from the emulator."""
    monkeypatch.setenv("FLEXNPU_ACLSERVER_BACKEND", "ascend")
    monkeypatch.setenv("FLEXNPU_ASCEND_LIBRARY", str(emulator))
    monkeypatch.setenv("FLEXNPU_EMU_MEMORY", str(48 * MIB))
    with aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, memory=QUOTA)], ledger_dir=str(tmp_path / "l")
    ) as server:
        conf = tmp_path / "client.conf"
        conf.write_text(clientconf.render(server.conf()))
        res = run(acl_check, "hold", str(32 * MIB), conf=conf)
        assert "val hold_code 0" in res.stdout, res.stdout + server.stderr()
        assert f"val hold_free {16 * MIB}" in res.stdout and f"val hold_total {QUOTA}" in res.stdout, (
            res.stdout
        )
        die = run(acl_check, "hold", str(56 * MIB), conf=conf)  # within the quota, beyond the die
        assert "val hold_code 207001" in die.stdout and "EL0004" in die.stdout, die.stdout
        over = run(acl_check, "hold", str(2 * QUOTA), conf=conf)  # beyond the quota: refused first
        assert "val hold_code 207001" in over.stdout and "exceeds the memory quota" in over.stdout
        # copies both ways (plain and aclrtMallocHost memory), memset, device to device: aclrtMemcpy
        # and aclrtMemset in the emulator, content checked by the program
        run(acl_check, "memcpy", str(server.spec.staging_bytes), conf=conf).ok()


@pytest.mark.parametrize("launcher", ["zygote", "spawn"])
def test_daemon_started_aclservers_take_the_backend_from_its_environment(
    emulator: Path, acl_check: Path, monkeypatch: pytest.MonkeyPatch, launcher: str
) -> None:
    """flexnpu-daemon with FLEXNPU_ACLSERVER_BACKEND=ascend: its aclservers (forked by the zygote or
    spawned) serve the claim from the CANN emulator (48 MiB die, 64 MiB quota)."""
    monkeypatch.setenv("FLEXNPU_ACLSERVER_BACKEND", "ascend")
    monkeypatch.setenv("FLEXNPU_ASCEND_LIBRARY", str(emulator))
    monkeypatch.setenv("FLEXNPU_EMU_DEVICES", "8")
    monkeypatch.setenv("FLEXNPU_EMU_MEMORY", str(48 * MIB))
    daemon = DaemonProc(extra=("--launcher", launcher)).start()
    try:
        uid = str(uuid.uuid4())
        with daemon.client() as c:
            res = c.register(daemon_harness.request(uid, daemon_harness.share(2, mem_gib=QUOTA / (1 << 30))))
        conf = daemon.root / "client.conf"
        conf.write_text(
            clientconf.render(
                clientconf.ClientConf(
                    claim_uid=uid,
                    token="ab" * 16,
                    endpoints=clientconf.Endpoints(unix=res.endpoints.unix_socket),
                    shm_dir=res.endpoints.shm_dir,
                    shares=(clientconf.ShareInfo(0, QUOTA, 30, codes.Policy.FIXED),),
                )
            )
        )
        out = run(acl_check, "hold", str(32 * MIB), conf=conf).stdout
        assert "val hold_code 0" in out and f"val hold_free {16 * MIB}" in out, out + daemon.log()
    finally:
        daemon.cleanup()


def test_memcpy_through_regions_and_a_truncated_one(
    backend: tuple[AscendBackend, Emu], tmp_path: Path
) -> None:
    """The backend's memcpy without host-addressable memory: data-link regions on both sides of
    aclrtMemcpy; a region the client truncated fails that copy (the session answers 100000)."""
    b, emu = backend
    region = datalink.create_region(str(tmp_path), "host-1.buf", 8192, 1)
    try:
        region.write_from(0, memoryview(bytes(range(256)) * 32))
        dev = b.malloc(0, 8192, 0)
        host = wire_datalink.host_ptr(1, 0)
        b.memcpy(dst=dev, src=host, count=8192, span=8192, dst_region=None, src_region=region)
        back = bytearray(8192)
        b.copy_from_device(dev, memoryview(back))
        assert bytes(back) == bytes(range(256)) * 32
        b.memset(dev, 7, 100)
        b.memcpy(dst=host + 4000, src=dev, count=100, span=100, dst_region=region, src_region=None)
        out = memoryview(bytearray(100))
        region.read_into(4000, out)
        assert bytes(out) == b"\x07" * 100
        with pytest.raises(AclFailure) as err:  # the device side is checked for the whole span first
            b.memcpy(dst=dev, src=host, count=100, span=9000, dst_region=None, src_region=region)
        assert err.value.code == codes.ACL_ERROR_INVALID_PARAM and "run past" in err.value.message
        os.truncate(region.path, 100)
        copies = emu.calls("aclrtMemcpy")
        with pytest.raises(datalink.RegionTruncated):
            b.memcpy(dst=dev, src=host, count=8192, span=8192, dst_region=None, src_region=region)
        assert emu.calls("aclrtMemcpy") == copies  # nothing reached the device
    finally:
        region.close()


def _copy_model(*, batch: bool = False) -> bytes:
    """A model the emulator runs: output 0 copies input 0 (float32[8], or [-1, 8] with gears 1, 2)."""
    from flexnpu_wire import modelfile as mf

    dims = (-1, 8) if batch else (8,)
    inputs = [mf.Tensor("x", 0, mf.FORMAT_ND, dims)]
    if batch:
        inputs.append(mf.Tensor(mf.DYNAMIC_TENSOR_NAME, 9, mf.FORMAT_ND, (1,)))
    return mf.render(
        mf.ModelFile(
            inputs=tuple(inputs),
            outputs=(mf.Output(mf.Tensor("y", 0, mf.FORMAT_ND, dims)),),
            weight_bytes=64,
            work_bytes=4096,
            weights=b"\x11" * 64,
            batch_gears=(1, 2) if batch else (),
        )
    )


def test_models_are_forwarded_to_cann_with_the_memory_the_book_charged(
    backend: tuple[AscendBackend, Emu],
) -> None:
    from flexnpu_runtime.aclserver.backend import Buffer

    b, emu = backend
    data = memoryview(bytearray(_copy_model()))
    desc = b.describe_model(data)
    assert (desc.work_bytes, desc.weight_bytes, desc.input_size(0), desc.outputs[0].tensor.name) == (
        4096,
        64,
        32,
        "y",
    )
    find = b.book.find
    buf = lambda ptr, size: Buffer(ptr, size, find(ptr))  # noqa: E731
    weight, work = b.malloc(0, 64, 0, owner=1), b.malloc(0, 4096, 0, owner=1)
    model = b.load_model(0, data, desc, weight=buf(weight, 64), work=buf(work, 4096))
    assert emu.calls("aclmdlLoadFromMemWithMem") == 1
    got = bytearray(64)
    b.copy_from_device(weight, memoryview(got))
    assert bytes(got) == b"\x11" * 64, "CANN loaded the weights into the memory the book holds"
    x, y = b.malloc(0, 32, 0, owner=1), b.malloc(0, 32, 0, owner=1)
    b.copy_to_device(x, memoryview(bytes(range(32))))
    cost, run = b.execution(model, [buf(x, 32)], [buf(y, 32)], batch=0, hw=(0, 0))
    assert cost == 0, "the first execution is charged nothing: CANN states no cost up front"
    run()
    out = bytearray(32)
    b.copy_from_device(y, memoryview(out))
    assert bytes(out) == bytes(range(32)) and emu.calls("aclmdlExecute") == 1
    assert b.execution(model, [buf(x, 32)], [buf(y, 32)], batch=0, hw=(0, 0))[0] >= 0
    b.unload_model(model)
    assert emu.calls("aclmdlUnload") == 1


def test_cann_errors_of_models_pass_through(backend: tuple[AscendBackend, Emu]) -> None:
    b, emu = backend
    data = memoryview(bytearray(_copy_model()))
    desc = b.describe_model(data)
    emu.fail_next("aclmdlLoadFromMemWithMem", 507011)
    with pytest.raises(AclFailure) as err:
        b.load_model(0, data, desc, weight=None, work=None)
    assert err.value.code == 507011
    with pytest.raises(AclFailure) as err:
        b.describe_model(memoryview(bytearray(b"not a model" * 10)))
    assert err.value.code == 507011


def test_models_through_the_aclserver_with_the_ascend_backend(
    emulator: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client -> aclserver (--backend ascend) -> CANN's aclmdl* in the emulator, which copies
    the set batch's part of the input: the batch reached CANN's aclmdlSetDynamicBatchSize."""
    from flexnpu_client import AclError, Session
    from flexnpu_wire.codes import MemcpyKind
    from flexnpu_wire.ops import Op

    monkeypatch.setenv("FLEXNPU_ACLSERVER_BACKEND", "ascend")
    monkeypatch.setenv("FLEXNPU_ASCEND_LIBRARY", str(emulator))
    with aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, memory=QUOTA)], ledger_dir=str(tmp_path / "l")
    ) as server, Session.open(server.conf()) as s:  # fmt: skip
        s.init()
        s.set_device(0)
        mid = s.load_model(_copy_model(batch=True))
        desc = s.model_desc(mid)
        assert desc.batch_gears == (1, 2) and desc.input_size(0) == 64 and desc.dynamic_index() == 1
        x, y, dyn = s.malloc(64), s.malloc(64), s.malloc(8)
        s.memcpy(x, 64, bytes(range(64)), 64, MemcpyKind.HOST_TO_DEVICE)
        for batch, copied in ((2, bytes(range(64))), (1, bytes(range(32)) + bytes(32))):
            s.memset(y, 64, 0, 64)
            s.memcpy(dyn, 8, batch.to_bytes(8, "little"), 8, MemcpyKind.HOST_TO_DEVICE)
            s.execute_model(mid, [(x, 64), (dyn, 8)], [(y, 64)])
            assert s.copy_from_device(y, 64) == copied, f"batch {batch}"
        s.unload_model(mid)
        assert s.get_mem_info()[0] == QUOTA - 64 - 64 - 32, "only x, y and the batch buffer are still held"
        # a model whose memory does not fit the share is refused before CANN loads it
        s.malloc(QUOTA - 2048 - 160)
        loads = s.call(Op.GET_STATS)  # any call: the session is alive
        with pytest.raises(AclError) as err:
            s.load_model(_copy_model())
        assert err.value.ret == codes.ACL_ERROR_RT_MEMORY_ALLOCATION and "work memory" in err.value.message
        assert loads == s.call(Op.GET_STATS)
