"""Operators and virtual memory forwarded by the ascend backend (issue 24 items 3 and 4), end to end: a real C
program (tests/c/ascend_ops.c) through the share's libascendcl.so and libopapi.so, a real aclserver with the
ascend backend, and the CANN emulator (tests/c/cann_emulator.c) as the host's libascendcl.so, libopapi.so and
libacl_op_compiler.so. The emulator computes Add, MatMul, aclnnAdds and aclnnMatmul for real and logs every call
it is given (op, dtypes, shapes, strides, placements, attribute setters, workspace, stream), which the tests
read; not verified on an NPU.
"""

from __future__ import annotations

import ctypes
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexnpu_runtime.aclserver.ascend_aclnn import ACLNN_C_TYPES
from flexnpu_runtime.aclserver.backend import AclFailure
from flexnpu_runtime.aclserver.backend_ascend import AscendBackend
from flexnpu_testing import aclserver_harness, clibrary
from flexnpu_wire import clientconf, codes, opcall
from flexnpu_wire.opcall import AttrKind, OpCall, Placement, Tensor
from tests.c.conftest import HERE, MIB, run
from tests.c.test_backend_ascend import Emu, emulator, emulator_build  # noqa: F401 (fixtures)

QUOTA = 64 * MIB
ROOT = HERE.parent.parent


@pytest.fixture
def cann_dir(emulator: Path) -> Path:  # noqa: F811
    """The emulator as the host's libascendcl.so, and (one library, one state) its libopapi.so and
    libacl_op_compiler.so beside it, as CANN installs them."""
    for name in ("libopapi.so", "libacl_op_compiler.so"):
        (emulator.parent / name).symlink_to(emulator.name)
    return emulator.parent


@pytest.fixture(scope="module")
def ascend_ops(library: Path) -> Path:
    return clibrary.compile_program(
        HERE / "ascend_ops.c",
        link_library=library,
        extra_flags=[f"-L{library.parent}", "-Wl,--no-as-needed", "-lopapi", "-lruntime", "-lm"],
    )


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _wait_for(log: Path, *wanted: str, count: int = 1, timeout: float = 20.0) -> list[str]:
    """The log once each of ``wanted`` starts ``count`` of its lines (or at the deadline: the test's
    assertions then say what is missing)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = _lines(log)
        if (
            all(sum(line.startswith(w) for line in lines) >= count for w in wanted)
            or time.monotonic() > deadline
        ):
            return lines
        time.sleep(0.05)


@pytest.fixture
def server_log(
    cann_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Path, Path]]:
    """An aclserver (ascend backend, 64 MiB quota) whose CANN logs its calls: (client.conf, the log)."""
    log = tmp_path / "cann.log"
    monkeypatch.setenv("FLEXNPU_ACLSERVER_BACKEND", "ascend")
    monkeypatch.setenv("FLEXNPU_ASCEND_LIBRARY", str(cann_dir / "libascendcl.so"))
    monkeypatch.setenv("FLEXNPU_EMU_LOG", str(log))
    with aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, die=1, memory=QUOTA)], ledger_dir=str(tmp_path / "l")
    ) as server:
        conf = tmp_path / "client.conf"
        conf.write_text(clientconf.render(server.conf()))
        yield conf, log


def _program(exe: Path, part: str, conf: Path, *args: str) -> dict[str, str]:
    res = run(exe, part, *args, conf=conf, LD_LIBRARY_PATH=str(clibrary.LIBRARY_DIR / "build"))
    assert res.rc == 0 and "FAIL" not in res.stdout, res.stdout + res.stderr
    return res.values


def test_single_operators_reach_the_hosts_cann(ascend_ops: Path, server_log: tuple[Path, Path]) -> None:
    conf, log = server_log
    values = _program(ascend_ops, "aclop", conf)
    assert values["refused_code"] == "100024"
    lines = [line for line in _lines(log) if line.startswith("aclopCompileAndExecute")]
    # the 0-d scalar placed on the host, the device tensors' shapes, every attribute through its own setter
    assert lines[0] == "aclopCompileAndExecute Add in d0[4,4]dev d0[]host out d0[4,4]dev attrs stream 1", (
        lines
    )
    mm = lines[1]
    assert mm.startswith("aclopCompileAndExecute MatMul in d0[4,4]dev d0[4,4]dev out d0[4,4]dev attrs "), mm
    for attr in ("transpose_x1:b0", "transpose_x2:b1", "offset_x:i7", "alpha:f0.5", "mode:s4", "dst_type:t1",
                 "axes:I2", "scales:F3", "flags:B1", "types:T2", "names:S2", "pads:L2"):  # fmt: skip
        assert f" {attr} " in mm, (attr, mm)
    assert lines[2].startswith(
        "aclopCompileAndExecute MatMul in d0[4,4]dev d0[4,4]dev undefined out d0[4,4]dev "
    )
    lines.pop(2)  # CANN's placeholder for the left-out bias
    assert lines[2].startswith("aclopCompileAndExecute NoSuchOp ")
    assert all(line.endswith(" stream 1") for line in lines), "one CANN stream, the backend's"
    assert len(lines) == 4, "the strided OnesLike was refused before CANN; then Add ran once more"


def test_aclnn_functions_reach_the_hosts_libopapi(ascend_ops: Path, server_log: tuple[Path, Path]) -> None:
    conf, log = server_log
    values = _program(ascend_ops, "aclnn", conf)
    assert values["aclnn_refused_code"] == "161002" and values["workspace_code"] == str(
        codes.ACL_ERROR_RT_MEMORY_ALLOCATION
    )
    lines = _lines(log)
    adds = (
        "aclnnAddsGetWorkspaceSize self=d0[2,3]s[3,1]o0 other=t0:2.5 alpha=t9:2 out=d0[2,3]s[3,1]o0 ws 4096"
    )
    assert lines[0] == adds, lines
    assert lines[1] == "aclnnAdds ws 4096 dev stream 1", "the workspace is device memory of the share"
    assert lines[2] == (
        "aclnnMatmulGetWorkspaceSize self=d0[2,3]s[3,1]o0 mat2=d0[3,2]s[1,3]o0 out=d0[2,2]s[2,1]o0"
        " cubeMathType=1 ws 0"
    )
    assert lines[3] == "aclnnMatmul ws 0 stream 1"
    # a tensor list: its tensors, in order, as CANN's aclTensorList
    tensor = "tensors=d0[2,3]s[3,1]o0"
    assert lines[4] == f"aclnnCatGetWorkspaceSize tensors 2 {tensor} {tensor} out=d0[4,3]s[3,1]o0 dim 0 ws 0"
    assert lines[5] == "aclnnCat ws 0 stream 1"
    assert lines[6].endswith("cubeMathType=0 refused 161002")
    # the workspace beyond the quota: GetWorkspaceSize ran, the launch never reached CANN
    assert lines[7] == adds and lines[8] == adds and lines[9] == "aclnnAdds ws 4096 dev stream 1", lines


def test_virtual_memory_is_forwarded_and_charged(ascend_ops: Path, server_log: tuple[Path, Path]) -> None:
    conf, log = server_log
    values = _program(ascend_ops, "vmm", conf)
    gran = 2 * MIB
    assert values["vmm_charged"] == str(2 * gran)
    lines = _lines(log)
    lines = lines[: lines.index("aclrtReserveMemAddress 4194304")]
    assert lines[:2] == ["aclrtReserveMemAddress 8388608", f"aclrtMallocPhysical {gran} device 1 memAttr 4"]
    assert lines.count(f"aclrtMapMem {gran} offset 0") == 2 and lines.count(f"aclrtUnmapMem {gran}") == 2
    assert lines[-3:] == [
        f"aclrtFreePhysical {gran}",
        f"aclrtFreePhysical {gran}",
        "aclrtReleaseMemAddress 8388608",
    ]
    assert sum(line.startswith("aclrtMallocPhysical") for line in lines) == 2, (
        "beyond the quota: refused before CANN"
    )
    assert "aclopCompileAndExecute Add in d0[1024]dev d0[]host out d0[1024]dev attrs stream 1" in lines
    # the program exited with a range mapped: its session's close unmaps, frees and releases it at CANN
    _wait_for(log, "aclrtReleaseMemAddress 4194304")
    tail = _wait_for(log, f"aclrtFreePhysical {gran}", count=3)  # two freed by the program, one at its close
    end = tail[tail.index("aclrtReserveMemAddress 4194304") :]
    assert {f"aclrtFreePhysical {gran}", "aclrtReleaseMemAddress 4194304", f"aclrtUnmapMem {gran}"} <= set(
        end
    )
    assert end.index(f"aclrtUnmapMem {gran}") < min(
        end.index(f"aclrtFreePhysical {gran}"), end.index("aclrtReleaseMemAddress 4194304")
    ), "unmapped before CANN is asked to free or release"


def test_kernel_binaries_are_loaded_once_and_launched_on_the_hosts_cann(
    ascend_ops: Path, server_log: tuple[Path, Path]
) -> None:
    conf, log = server_log
    values = _program(ascend_ops, "kernels", conf)
    assert values["kernel_fault"] == "507015"
    binary = len("EMUKBIN\nfill_u32\nunused\n")
    lines = _lines(log)
    assert lines[:2] == [f"aclrtBinaryLoadFromData {binary}", "aclrtBinaryGetFunction fill_u32"], lines
    assert lines[2] == "aclrtLaunchKernelWithHostArgs fill_u32 blocks 8 args 16 stream 1", (
        "arguments by value, the block dim"
    )
    assert lines.count(f"aclrtBinaryLoadFromData {binary}") == 1, "once per load, no options: none forwarded"
    assert f"aclrtBinaryLoadFromData {binary} magic 0x41415246" in lines, (
        "from a file with ACL_RT_BINARY_LOAD_OPT_MAGIC (vector core): the option reaches the host's CANN"
    )
    assert f"aclrtBinaryLoadFromData {binary} magic 0x43554245" in lines, (
        "rtDevBinaryRegister: rtDevBinary_t's magic (RT_DEV_BINARY_MAGIC_ELF) as the load option"
    )
    assert f"aclrtBinaryUnLoad {binary}" in lines
    assert "aclrtLaunchKernelWithHostArgs fill_u32 blocks 2 args 16 stream 1" in lines, "aclrtLaunchKernelV2"
    assert "aclrtLaunchKernelWithHostArgs fill_u32 blocks 3 args 16 stream 1" in lines, (
        "aclrtLaunchKernelWithHostArgs"
    )
    assert "aclrtLaunchKernelWithHostArgs fill_u32 blocks 4 args 16 stream 1" in lines, (
        "rtKernelLaunch of the stub"
    )
    # the binary the program left loaded is unloaded when its session closes
    lines = _wait_for(log, "aclrtBinaryUnLoad", count=3)
    assert lines[-1] == f"aclrtBinaryUnLoad {binary}" and lines.count(f"aclrtBinaryUnLoad {binary}") == 3


def test_a_binary_is_charged_to_host_memory_while_it_is_shipped(
    ascend_ops: Path, cann_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hostMemory 16 MiB: a 24 MiB binary is refused (207001, naming hostMemory) before it reaches CANN."""
    log = tmp_path / "cann.log"
    monkeypatch.setenv("FLEXNPU_ACLSERVER_BACKEND", "ascend")
    monkeypatch.setenv("FLEXNPU_ASCEND_LIBRARY", str(cann_dir / "libascendcl.so"))
    monkeypatch.setenv("FLEXNPU_EMU_LOG", str(log))
    with aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, memory=QUOTA, host_memory=16 * MIB)],
        ledger_dir=str(tmp_path / "l"), staging_bytes=1 * MIB,
    ) as server:  # fmt: skip
        conf = tmp_path / "client.conf"
        conf.write_text(clientconf.render(server.conf()))
        values = _program(ascend_ops, "kernels-big", conf, str(24 * MIB))
    assert values["big_load"] == str(codes.ACL_ERROR_RT_MEMORY_ALLOCATION)
    loads = [line for line in _lines(log) if line.startswith("aclrtBinaryLoadFromData")]
    assert loads == [f"aclrtBinaryLoadFromData {len('EMUKBIN_fill_u32_unused_')}"], (
        "only the small one reached CANN"
    )


def test_kernel_binaries_on_the_emulated_backend_answer_200001(ascend_ops: Path, tmp_path: Path) -> None:
    with aclserver_harness.running_aclserver(
        tmp_path, shares=[aclserver_harness.share(0, memory=QUOTA)], ledger_dir=str(tmp_path / "l")
    ) as server:
        conf = tmp_path / "client.conf"
        conf.write_text(clientconf.render(server.conf()))
        values = _program(ascend_ops, "kernels-emulated", conf)
    assert values["emulated_load"] == str(codes.ACL_ERROR_API_NOT_SUPPORT)


# -- in process: the backend's entry point with calls a Python client makes ------------------------


@pytest.fixture
def backend(cann_dir: Path, tmp_path: Path) -> Iterator[tuple[AscendBackend, Emu]]:
    spec = aclserver_harness.make_spec(
        tmp_path, shares=[aclserver_harness.share(0, memory=QUOTA)], ledger_dir=str(tmp_path / "l")
    )
    b = AscendBackend(spec, library=str(cann_dir / "libascendcl.so"))
    yield b, Emu(cann_dir / "libascendcl.so")
    b.close()


def _dev(address: int, dims: tuple[int, ...], *, strides: tuple[int, ...] = ()) -> Tensor:
    return Tensor(Placement.DEVICE, 0, 2, dims, strides or opcall.contiguous(dims), 0, address)


def _floats(b: AscendBackend, ptr: int, n: int) -> list[float]:
    out = bytearray(4 * n)
    b.copy_from_device(ptr, memoryview(out))
    return list(memoryview(out).cast("f"))


def test_execute_operator_and_refusals(backend: tuple[AscendBackend, Emu]) -> None:
    b, emu = backend
    x, y = b.malloc(0, 16, 0, owner=1), b.malloc(0, 16, 0, owner=1)
    b.copy_to_device(x, memoryview(bytearray((ctypes.c_float * 4)(1, 2, 3, 4))))
    one = Tensor(Placement.HOST, 0, 2, (), (), 0, data=bytes(ctypes.c_float(10.0)))
    used = b.execute_operator(OpCall("Add", (_dev(x, (4,)), one), (_dev(y, (4,)),)), device=0, owner=1)
    assert used >= 1 and _floats(b, y, 4) == [11, 12, 13, 14]
    assert emu.calls("aclrtCreateStream") == 1 and emu.calls("aclopCompileAndExecute") == 1
    with pytest.raises(AclFailure) as err:  # CANN's code and text, the op named
        b.execute_operator(OpCall("Gelu", (_dev(x, (4,)),), (_dev(y, (4,)),)), device=0, owner=1)
    assert (
        err.value.code == 100024 and err.value.message.startswith("Gelu: ") and "EZ3003" in err.value.message
    )
    short = Tensor(Placement.HOST, 0, 2, (4,), (1,), 0, data=bytes(ctypes.c_float(10.0)))
    with pytest.raises(AclFailure) as err:  # a host operand shorter than its dims: never handed to CANN
        b.execute_operator(OpCall("Add", (_dev(x, (4,)), short), (_dev(y, (4,)),)), device=0, owner=1)
    assert err.value.code == codes.ACL_ERROR_INVALID_PARAM and "inputs[1] holds 4 bytes" in err.value.message
    assert emu.calls("aclopCompileAndExecute") == 2, "Add and Gelu only"
    with pytest.raises(AclFailure) as err:  # not in the host's libopapi.so
        b.execute_operator(OpCall("aclnnGelu", (_dev(x, (4,)),), (_dev(y, (4,)),)), device=0, owner=1)
    assert err.value.code == 100024 and "aclnnGelu" in err.value.message
    with pytest.raises(AclFailure) as err:  # a parameter the launch lacks
        b.execute_operator(
            OpCall("aclnnAdds", (_dev(x, (4,)),), (_dev(y, (4,)),), {"other": 1}), device=0, owner=1
        )
    assert err.value.code == codes.ACL_ERROR_INVALID_PARAM and "alpha" in err.value.message
    emu.fail_next("aclopCompileAndExecute", 507015)  # an injected runtime failure passes through
    with pytest.raises(AclFailure) as err:
        b.execute_operator(OpCall("Add", (_dev(x, (4,)), one), (_dev(y, (4,)),)), device=0, owner=1)
    assert err.value.code == 507015
    free = b.mem_info(0)[0]
    call = OpCall("aclnnAdds", (_dev(x, (4,)),), (_dev(y, (4,)),), {"other": 0.5, "alpha": 2},
                  {"other": AttrKind.FLOAT, "alpha": AttrKind.INT})  # fmt: skip
    b.execute_operator(call, device=0, owner=1)
    assert _floats(b, y, 4) == [2, 3, 4, 5] and b.mem_info(0)[0] == free, "the workspace came back"


def test_aclnn_c_types_agree_with_the_table() -> None:
    """The parameters ACLNN_C_TYPES narrows are exactly those aclnn_api.json declares narrower than their
    kind's default C type (int: int64_t/uint64_t, double: double)."""
    table = json.loads((ROOT / "libascendcl" / "api" / "aclnn_api.json").read_text())
    narrow = {"int8_t": ctypes.c_int8, "float": ctypes.c_float}
    for row in table["functions"]:
        for p in row["params"]:
            if p["kind"] not in ("int", "double"):
                continue
            got = ACLNN_C_TYPES.get((row["name"], p["name"])) or ACLNN_C_TYPES.get(("*", p["name"]))
            assert got is narrow.get(p["ctype"]), (row["name"], p)


def test_the_physical_memory_prop_has_canns_layout() -> None:
    """The ctypes aclrtPhysicalMemProp the backend passes to aclrtMallocPhysical, and the aclrtBinaryLoadOption(s)
    it passes to aclrtBinaryLoadFromData, match the C header's."""
    from flexnpu_runtime.aclserver.ascend_vmm import PhysicalMemProp
    from flexnpu_runtime.aclserver.backend_ascend import _BinaryLoadOption, _BinaryLoadOptions

    exe = clibrary.compile_program(HERE / "physical_prop_layout.c")
    words = run(exe, conf=None).stdout.split()
    c_layout = dict(zip(words[::2], (int(w) for w in words[1::2]), strict=True))
    py_layout: dict[str, int] = {}
    for prefix, struct in (
        ("", PhysicalMemProp),
        ("option.", _BinaryLoadOption),
        ("options.", _BinaryLoadOptions),
    ):
        py_layout[f"{prefix}size"] = ctypes.sizeof(struct)
        py_layout |= {prefix + field[0]: getattr(struct, field[0]).offset for field in struct._fields_}
    assert py_layout == c_layout


def test_the_client_side_of_kernel_binaries_is_sanitizer_clean(server_log: tuple[Path, Path]) -> None:
    """The kernel-binary and operator calls of the C client (kernel.c, runtime.c, op.c) under ASan/UBSan with leak
    detection, against the ascend backend."""
    conf, _log = server_log
    lib = clibrary.build_library(sanitized=True)
    exe = clibrary.compile_program(
        HERE / "ascend_ops.c",
        link_library=lib,
        extra_flags=[*clibrary.SANITIZERS, "-g", f"-L{lib.parent}", "-Wl,--no-as-needed", "-lopapi", "-lruntime",
                     "-lm"],
        out_dir=lib.parent,
    )  # fmt: skip
    for part in ("kernels", "aclop"):
        res = run(exe, part, conf=conf, LD_LIBRARY_PATH=str(lib.parent), ASAN_OPTIONS="detect_leaks=1")
        assert res.rc == 0 and not res.failures, res.stdout[-3000:] + res.stderr[-3000:]
        assert "ERROR: " not in res.stderr and "runtime error" not in res.stderr, res.stderr[-3000:]


_BAD_KERNEL_MESSAGES: list[tuple[str, str, tuple[int | str, ...], bytes, int, str]] = [
    # (what, op, ints (binary/function: the session's own), tail, code, words the error names)
    ("an unknown blob", "BINARY_LOAD", (999,), b"", codes.ACL_ERROR_INVALID_PARAM, "model bytes 999"),
    ("a magic past uint32", "BINARY_LOAD", (999, 1 << 32), b"", codes.ACL_ERROR_INVALID_PARAM, "magic"),
    ("an unknown binary", "BINARY_GET_FUNCTION", (999,), b"fill_u32", codes.ACL_ERROR_INVALID_PARAM, "999"),
    ("an empty kernel name", "BINARY_GET_FUNCTION", ("bin",), b"", codes.ACL_ERROR_INVALID_PARAM, "kernel name"),
    ("an oversized kernel name", "BINARY_GET_FUNCTION", ("bin",), b"k" * 257, codes.ACL_ERROR_INVALID_PARAM,
     "kernel name"),
    ("a NUL in the kernel name", "BINARY_GET_FUNCTION", ("bin",), b"fill\0u32", codes.ACL_ERROR_INVALID_PARAM,
     "kernel name"),
    ("a kernel the binary lacks", "BINARY_GET_FUNCTION", ("bin",), b"missing", 107000, "missing"),
    ("an unknown function", "LAUNCH_FUNCTION", ("stream", 999, 1), b"", codes.ACL_ERROR_INVALID_PARAM,
     "999 is not a function"),
    ("block dim 0", "LAUNCH_FUNCTION", ("stream", "fn", 0), b"", codes.ACL_ERROR_INVALID_PARAM, "block dim"),
    ("block dim past uint32", "LAUNCH_FUNCTION", ("stream", "fn", 1 << 32), b"", codes.ACL_ERROR_INVALID_PARAM,
     "block dim"),
    ("oversized arguments", "LAUNCH_FUNCTION", ("stream", "fn", 1), b"\0" * (64 * 1024 + 1),
     codes.ACL_ERROR_INVALID_PARAM, "argument bytes"),
    ("an unknown stream", "LAUNCH_FUNCTION", (0x7777, "fn", 1), b"", codes.ACL_ERROR_INVALID_RESOURCE_HANDLE,
     "stream"),
    ("a wrong count of values", "LAUNCH_FUNCTION", ("stream", "fn"), b"", codes.ACL_ERROR_INVALID_PARAM,
     "takes 3 values, got 2"),
    ("an unknown binary to unload", "BINARY_UNLOAD", (999,), b"", codes.ACL_ERROR_INVALID_PARAM, "999"),
]  # fmt: skip


def test_malformed_kernel_binary_messages_are_refused_and_the_session_goes_on(
    cann_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ops 67-70 with unknown handles, bad sizes and wrong counts against a real aclserver (ascend backend):
    each is refused with a code and a message naming the field; the same session then loads and launches a
    kernel, and another session of the share cannot use this one's binary or function numbers."""
    from flexnpu_client import AclError, Session
    from flexnpu_wire.framing import Op

    monkeypatch.setenv("FLEXNPU_ACLSERVER_BACKEND", "ascend")
    monkeypatch.setenv("FLEXNPU_ASCEND_LIBRARY", str(cann_dir / "libascendcl.so"))
    monkeypatch.setenv("FLEXNPU_EMU_LOG", str(tmp_path / "cann.log"))
    binary = b"EMUKBIN\nfill_u32\nunused\n"
    with (
        aclserver_harness.running_aclserver(
            tmp_path, shares=[aclserver_harness.share(0, die=1, memory=QUOTA)], ledger_dir=str(tmp_path / "l")
        ) as server,
        Session.open(server.conf()) as s,
    ):
        s.init()
        s.set_device(0)
        stream = s.create_stream()
        (bin_id,) = s.call(Op.BINARY_LOAD, s.send_model(binary))
        (fn,) = s.call(Op.BINARY_GET_FUNCTION, bin_id, tail=b"fill_u32")
        again = [s.call(Op.BINARY_GET_FUNCTION, bin_id, tail=b"fill_u32")[0] for _ in range(3)]
        assert again == [fn] * 3, "a kernel looked up again is the same function (the session holds one)"
        own = {"bin": bin_id, "fn": fn, "stream": stream}
        for what, op, ints, tail, code, named in _BAD_KERNEL_MESSAGES:
            values = [
                own[v] if isinstance(v, str) else v for v in ints
            ]  # "bin", "fn", "stream": the session's
            with pytest.raises(AclError) as err:
                s.call(Op[op], *values, tail=tail)
            assert err.value.ret == code and named in err.value.message, (
                what,
                err.value.ret,
                err.value.message,
            )
        assert server.proc.poll() is None, "the aclserver survived every malformed message"
        # the session goes on: a launch with its arguments by value fills device memory
        ptr = s.malloc(1024)
        s.call(Op.LAUNCH_FUNCTION, stream, fn, 1, tail=ptr.to_bytes(8, "little") + (256).to_bytes(4, "little")
               + (7).to_bytes(4, "little"))  # fmt: skip
        s.synchronize_stream(stream)
        assert s.copy_from_device(ptr, 1024) == (7).to_bytes(4, "little") * 256
        with Session.open(server.conf()) as other:  # handles are the session's own
            other.init()
            other.set_device(0)
            other_stream = other.create_stream()
            refused: tuple[tuple[Op, tuple[int, ...], bytes], ...] = (
                (Op.BINARY_GET_FUNCTION, (bin_id,), b"fill_u32"),
                (Op.LAUNCH_FUNCTION, (other_stream, fn, 1), b""),
                (Op.BINARY_UNLOAD, (bin_id,), b""),
            )
            for other_op, other_values, other_tail in refused:
                with pytest.raises(AclError) as err:
                    other.call(other_op, *other_values, tail=other_tail)
                assert (
                    err.value.ret == codes.ACL_ERROR_INVALID_PARAM and "of this client" in err.value.message
                )
        s.call(Op.BINARY_UNLOAD, bin_id)


def test_a_loaded_binary_stays_charged_to_host_memory_until_it_is_unloaded(
    cann_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hostMemory 16 MiB: two 6 MiB binaries load; a third does not fit while they are loaded (the host's CANN
    holds their copies), and loads once one of them was unloaded."""
    from flexnpu_client import AclError, Session
    from flexnpu_wire.framing import Op

    monkeypatch.setenv("FLEXNPU_ACLSERVER_BACKEND", "ascend")
    monkeypatch.setenv("FLEXNPU_ASCEND_LIBRARY", str(cann_dir / "libascendcl.so"))
    monkeypatch.setenv("FLEXNPU_EMU_LOG", str(tmp_path / "cann.log"))
    binary = b"EMUKBIN\nfill_u32\n".ljust(6 * MIB, b"\n")
    with (
        aclserver_harness.running_aclserver(
            tmp_path, shares=[aclserver_harness.share(0, memory=QUOTA, host_memory=16 * MIB)],
            ledger_dir=str(tmp_path / "l"), staging_bytes=1 * MIB,
        ) as server,
        Session.open(server.conf()) as s,
    ):  # fmt: skip
        s.init()
        s.set_device(0)
        loaded = [s.call(Op.BINARY_LOAD, s.send_model(binary))[0] for _ in range(2)]
        with pytest.raises(AclError) as err:
            s.call(Op.BINARY_LOAD, s.send_model(binary))
        assert err.value.ret == codes.ACL_ERROR_RT_MEMORY_ALLOCATION and "hostMemory" in err.value.message
        s.call(Op.BINARY_UNLOAD, loaded.pop())
        loaded.append(s.call(Op.BINARY_LOAD, s.send_model(binary))[0])
        for b in loaded:
            s.call(Op.BINARY_UNLOAD, b)
