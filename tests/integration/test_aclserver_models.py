"""Models served by a real aclserver (emulated backend): load from bytes, describe, execute, unload.

Outputs are computed by the emulated format's elementwise ops and checked here; a model's weight
and work memory count against the share's quota (207001 at load when it does not fit), its
executions against the compute quota, and every bad input gets an ACL code and changes nothing.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from flexnpu_client import AclError, Session
from flexnpu_testing import aclserver_harness
from flexnpu_testing.aclserver_harness import RunningAclServer
from flexnpu_wire import codes
from flexnpu_wire import modelfile as mf
from flexnpu_wire.ops import Op

QUOTA = 64 << 20
F32, I32, ND = 0, 3, mf.FORMAT_ND
H2D = 1


def vector_model(
    n: int = 4, *, weight_bytes: int = 8, work_bytes: int = 4096, cost_us: int = 0
) -> mf.ModelFile:
    """x, y (float32[n]) -> 2x+1, int32(x+y), x*y, x+weights (weights 10, 20, ...)."""
    weights = struct.pack(f"<{weight_bytes // 4}f", *(10.0 * (i + 1) for i in range(weight_bytes // 4)))
    t = lambda name, dt=F32: mf.Tensor(name, dt, ND, (n,))  # noqa: E731
    return mf.ModelFile(
        inputs=(t("x"), t("y")),
        outputs=(
            mf.Output(t("affine"), mf.Op.AFFINE, 0, 0, 2.0, 1.0),
            mf.Output(t("sum", I32), mf.Op.ADD, 0, 1),
            mf.Output(t("product"), mf.Op.MUL, 0, 1),
            mf.Output(t("weighted"), mf.Op.ADD_WEIGHTS, 0),
        ),
        weight_bytes=weight_bytes,
        work_bytes=work_bytes,
        cost_us=cost_us,
        weights=weights,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAclServer]:
    work = tmp_path_factory.mktemp("models")
    with aclserver_harness.running_aclserver(
        work, shares=[aclserver_harness.share(0, memory=QUOTA), aclserver_harness.share(1, die=1, memory=QUOTA)],
        ledger_dir=str(work / "ledger"), staging_bytes=64 << 10,
    ) as srv:  # fmt: skip
        yield srv


@pytest.fixture
def session(server: RunningAclServer) -> Iterator[Session]:
    with Session.open(server.conf()) as s:
        s.init()
        s.set_device(0)
        yield s


def upload(s: Session, values: np.ndarray) -> int:
    ptr = s.malloc(values.nbytes)
    s.memcpy(ptr, values.nbytes, values.tobytes(), values.nbytes, H2D)
    return ptr


def download(s: Session, ptr: int, dtype: str, n: int) -> np.ndarray:
    return np.frombuffer(s.copy_from_device(ptr, n * np.dtype(dtype).itemsize), dtype)


def test_load_describe_execute_unload(session: Session) -> None:
    s = session
    model = vector_model(weight_bytes=16)
    data = mf.render(model)
    assert s.query_model_size(data) == (4096, 16)
    assert s.query_model_desc(data) == mf.parse_header(data)
    before = s.get_mem_info()[0]
    mid = s.load_model(data)
    assert s.get_mem_info()[0] == before - 4096 - 32, "work and weight memory are charged at load"
    desc = s.model_desc(mid)
    assert [t.name for t in desc.inputs] == ["x", "y"] and desc.output_size(1) == 16
    x, y = upload(s, np.array([1, 2, 3, 4], "<f4")), upload(s, np.array([0.5, 1.5, -2, 8], "<f4"))
    outs = [s.malloc(16) for _ in range(4)]
    s.execute_model(mid, [(x, 16), (y, 16)], [(o, 16) for o in outs])
    assert download(s, outs[0], "<f4", 4).tolist() == [3, 5, 7, 9]
    assert download(s, outs[1], "<i4", 4).tolist() == [1, 3, 1, 12]  # truncated toward zero
    assert download(s, outs[2], "<f4", 4).tolist() == [0.5, 3, -6, 32]
    assert download(s, outs[3], "<f4", 4).tolist() == [11, 22, 33, 44]
    s.unload_model(mid)
    assert s.get_mem_info()[0] == before - 6 * 32
    with pytest.raises(AclError) as err:
        s.model_desc(mid)
    assert err.value.ret == codes.ACL_ERROR_INVALID_MODEL_ID


def test_an_execution_with_the_buffers_of_the_last_one_checks_them_again(session: Session) -> None:
    """The same dataset as the last call is not looked up again unless one of its buffers was
    freed: a freed buffer fails the call as any unknown pointer, a new allocation works."""
    s = session
    mid = s.load_model(mf.render(vector_model()))
    x, y = upload(s, np.array([1, 2, 3, 4], "<f4")), upload(s, np.array([1, 1, 1, 1], "<f4"))
    outs = [s.malloc(16) for _ in range(4)]
    call = lambda: s.execute_model(mid, [(x, 16), (y, 16)], [(o, 16) for o in outs])  # noqa: E731
    call()
    call()
    assert download(s, outs[0], "<f4", 4).tolist() == [3, 5, 7, 9]
    s.free(outs[2])
    with pytest.raises(AclError) as err:
        call()
    assert err.value.ret == codes.ACL_ERROR_INVALID_PARAM and f"{outs[2]:#x}" in err.value.message
    outs[2] = s.malloc(16)
    call()
    assert download(s, outs[2], "<f4", 4).tolist() == [1, 2, 3, 4]
    s.unload_model(mid)


def test_a_model_larger_than_the_share_fails_at_load_with_207001(session: Session) -> None:
    s = session
    free = s.get_mem_info()[0]
    big = mf.render(vector_model(weight_bytes=8, work_bytes=QUOTA))
    with pytest.raises(AclError) as err:
        s.load_model(big)
    assert err.value.ret == codes.ACL_ERROR_RT_MEMORY_ALLOCATION
    assert "loading the model" in err.value.message and "work memory" in err.value.message
    assert s.get_mem_info()[0] == free, "a failed load holds nothing"


def test_with_mem_uses_the_callers_memory(session: Session) -> None:
    s = session
    model = vector_model(weight_bytes=8, work_bytes=1 << 20)
    weight, work = s.malloc(64), s.malloc(1 << 20)
    free = s.get_mem_info()[0]
    mid = s.load_model(mf.render(model), weight=(weight, 64), work=(work, 1 << 20))
    assert s.get_mem_info()[0] == free, "nothing more is taken from the quota"
    assert download(s, weight, "<f4", 2).tolist() == [10, 20], (
        "the weights were loaded into the caller's memory"
    )
    with pytest.raises(AclError) as err:
        s.load_model(mf.render(model), weight=(weight, 4), work=(work, 1 << 20))
    assert err.value.ret == codes.ACL_ERROR_INVALID_PARAM and "weight memory" in err.value.message
    s.free(weight)  # freed while loaded: charged until the model goes
    assert s.get_mem_info()[0] == free
    s.unload_model(mid)
    assert s.get_mem_info()[0] == free + 64
    s.free(work)


def test_dynamic_batch(session: Session) -> None:
    s = session
    model = mf.ModelFile(
        inputs=(mf.Tensor("x", F32, mf.FORMAT_NCHW, (-1, 2)), mf.Tensor(mf.DYNAMIC_TENSOR_NAME, 9, ND, (1,))),
        outputs=(mf.Output(mf.Tensor("y", F32, ND, (-1, 2)), mf.Op.AFFINE, 0, 0, 1.0, 100.0),),
        batch_gears=(1, 2, 4),
    )
    mid = s.load_model(mf.render(model))
    desc = s.model_desc(mid)
    assert desc.batch_gears == (1, 2, 4) and desc.input_size(0) == 4 * 2 * 4 and desc.dynamic_index() == 1
    x = upload(s, np.arange(8, dtype="<f4"))
    out = upload(s, np.full(8, -1, "<f4"))
    dyn = upload(s, np.array([2], "<u8"))
    s.execute_model(mid, [(x, 32), (dyn, 8)], [(out, 32)])
    assert download(s, out, "<f4", 8).tolist() == [100, 101, 102, 103, -1, -1, -1, -1]
    s.memcpy(dyn, 8, struct.pack("<Q", 3), 8, H2D)
    with pytest.raises(AclError) as err:
        s.execute_model(mid, [(x, 32), (dyn, 8)], [(out, 32)])
    assert err.value.ret == codes.ACL_ERROR_INVALID_PARAM and "gears" in err.value.message
    s.unload_model(mid)


def test_async_execution_on_a_stream_is_charged_die_time_and_keeps_its_buffers(session: Session) -> None:
    s = session
    mid = s.load_model(mf.render(vector_model(cost_us=200_000)))
    x, y = upload(s, np.ones(4, "<f4")), upload(s, np.ones(4, "<f4"))
    outs = [s.malloc(16) for _ in range(4)]
    stream = s.create_stream()
    used_before = s.call(Op.GET_USAGE, 0)[2]
    s.execute_model(mid, [(x, 16), (y, 16)], [(o, 16) for o in outs], stream=stream)
    s.free(x)  # the queued execution still reads it: charged until it ran
    free_while_queued = s.get_mem_info()[0]
    s.synchronize_stream(stream)
    assert s.get_mem_info()[0] == free_while_queued + 32
    assert download(s, outs[0], "<f4", 4).tolist() == [3, 3, 3, 3]
    assert s.call(Op.GET_USAGE, 0)[2] - used_before >= 200_000, (
        "the execution's cost is die time of the share"
    )
    s.unload_model(mid)


def test_unload_waits_for_queued_executions(session: Session) -> None:
    s = session
    mid = s.load_model(mf.render(vector_model(cost_us=100_000)))
    x, y = upload(s, np.ones(4, "<f4")), upload(s, np.ones(4, "<f4"))
    outs = [s.malloc(16) for _ in range(4)]
    stream = s.create_stream()
    done_before = s.stats()[0]
    for _ in range(3):
        s.execute_model(mid, [(x, 16), (y, 16)], [(o, 16) for o in outs], stream=stream)
    s.unload_model(mid)
    assert s.stats()[0] == done_before + 3, "all three executions ran before the model went"


@pytest.mark.parametrize(
    ("call", "ret"),
    [
        pytest.param(lambda s: s.load_model(b"not a model at all, but long enough " * 4), codes.ACL_ERROR_PARSE_MODEL,
                     id="not-a-model"),
        pytest.param(lambda s: s.load_model(mf.render(vector_model())[:-4]), codes.ACL_ERROR_MODEL_SIZE_INVALID,
                     id="truncated"),
        pytest.param(lambda s: s.load_model("/nonexistent/model.fnm"), codes.ACL_ERROR_READ_MODEL_FAILURE,
                     id="missing-file"),
        pytest.param(lambda s: s.execute_model(99, [], []), codes.ACL_ERROR_INVALID_MODEL_ID, id="unknown-model"),
        pytest.param(lambda s: s.unload_model(99), codes.ACL_ERROR_INVALID_MODEL_ID, id="unload-unknown"),
        pytest.param(lambda s: s.call(Op.MODEL_BYTES_WRITE, 7, 0, 0, 1), codes.ACL_ERROR_INVALID_PARAM,
                     id="write-unknown-blob"),
        pytest.param(lambda s: s.call(Op.MODEL_BYTES_OPEN, 0), codes.ACL_ERROR_MODEL_SIZE_INVALID, id="empty-blob"),
        pytest.param(lambda s: s.call(Op.MODEL_BYTES_OPEN, QUOTA * 4), codes.ACL_ERROR_RT_MEMORY_ALLOCATION,
                     id="blob-beyond-the-host-limit"),
    ],
)  # fmt: skip
def test_bad_model_calls(session: Session, call: object, ret: int) -> None:
    free = session.get_mem_info()
    with pytest.raises(AclError) as err:
        call(session)  # type: ignore[operator]
    assert err.value.ret == ret, err.value.message
    assert session.get_mem_info() == free


@pytest.mark.parametrize(
    ("input_sizes", "output_sizes", "ret"),
    [
        pytest.param([16], [16] * 4, codes.ACL_ERROR_MODEL_INPUT_NOT_MATCH, id="too-few-inputs"),
        pytest.param([16] * 2, [16] * 3, codes.ACL_ERROR_MODEL_OUTPUT_NOT_MATCH, id="too-few-outputs"),
        pytest.param([16, 8], [16] * 4, codes.ACL_ERROR_MODEL_INPUT_NOT_MATCH, id="input-buffer-too-small"),
        pytest.param(
            [16] * 2, [16, 16, 4, 16], codes.ACL_ERROR_MODEL_OUTPUT_NOT_MATCH, id="output-buffer-too-small"
        ),
        pytest.param([16, 32], [16] * 4, codes.ACL_ERROR_INVALID_PARAM, id="buffer-past-its-allocation"),
    ],
)
def test_bad_datasets(session: Session, input_sizes: list[int], output_sizes: list[int], ret: int) -> None:
    s = session
    mid = s.load_model(mf.render(vector_model()))
    bufs = [s.malloc(16) for _ in range(6)]
    done = s.stats()[0]
    with pytest.raises(AclError) as err:
        s.execute_model(
            mid, list(zip(bufs, input_sizes, strict=False)), list(zip(bufs[2:], output_sizes, strict=False))
        )
    assert err.value.ret == ret
    assert s.stats()[0] == done, "nothing ran"
    s.unload_model(mid)


def test_a_session_that_ends_unloads_its_models(server: RunningAclServer) -> None:
    with Session.open(server.conf()) as s:
        s.init()
        s.set_device(1)
        s.load_model(mf.render(vector_model(work_bytes=QUOTA // 2)))
        assert s.get_mem_info()[0] < QUOTA // 2 + 64
    with Session.open(server.conf()) as s:
        s.init()
        s.set_device(1)
        assert s.get_mem_info() == (QUOTA, QUOTA)


def test_model_file_from_a_path(session: Session, tmp_path: Path) -> None:
    path = tmp_path / "m.fnm"
    path.write_bytes(mf.render(vector_model()))
    mid = session.load_model(str(path))
    session.unload_model(mid)


def test_the_pyacl_shaped_calls(server: RunningAclServer, tmp_path: Path) -> None:
    """acl.mdl.* as a pyACL program uses them: outputs first, ret last, handles are opaque."""
    from flexnpu_client import acl
    from flexnpu_wire import clientconf

    conf = tmp_path / "client.conf"
    conf.write_text(clientconf.render(server.conf()))
    path = tmp_path / "m.fnm"
    path.write_bytes(mf.render(vector_model(weight_bytes=16)))
    assert acl.init(str(conf)) == 0
    try:
        assert acl.rt.set_device(0) == 0
        work, weight, ret = acl.mdl.query_size(str(path))
        assert (work, weight, ret) == (4096, 16, 0)
        model_id, ret = acl.mdl.load_from_file(str(path))
        assert ret == 0
        desc = acl.mdl.create_desc()
        assert acl.mdl.get_desc(desc, model_id) == 0
        assert (acl.mdl.get_num_inputs(desc), acl.mdl.get_num_outputs(desc)) == (2, 4)
        assert acl.mdl.get_input_dims(desc, 0) == ({"name": "x", "dimCount": 1, "dims": [4]}, 0)
        assert (
            acl.mdl.get_output_name_by_index(desc, 1) == "sum"
            and acl.mdl.get_output_data_type(desc, 1) == I32
        )
        assert acl.mdl.get_input_index_by_name(desc, "y") == (1, 0)
        assert acl.mdl.get_input_index_by_name(desc, "nope")[1] == codes.ACL_ERROR_INVALID_PARAM
        assert acl.mdl.get_dynamic_batch(desc) == ({"batchCount": 0, "batch": []}, 0)
        datasets = []
        for count, sizes in ((2, acl.mdl.get_input_size_by_index), (4, acl.mdl.get_output_size_by_index)):
            dataset = acl.mdl.create_dataset()
            for i in range(count):
                ptr, ret = acl.rt.malloc(sizes(desc, i), 0)
                assert ret == 0
                _, ret = acl.mdl.add_dataset_buffer(dataset, acl.create_data_buffer(ptr, sizes(desc, i)))
                assert ret == 0
            datasets.append(dataset)
        inputs, outputs = datasets
        x = np.array([1, 2, 3, 4], "<f4").tobytes()
        addr = acl.get_data_buffer_addr(acl.mdl.get_dataset_buffer(inputs, 0))
        assert acl.rt.memcpy(addr, 16, x, 16, H2D) == 0
        assert (
            acl.rt.memcpy(acl.get_data_buffer_addr(acl.mdl.get_dataset_buffer(inputs, 1)), 16, x, 16, H2D)
            == 0
        )
        stream, ret = acl.rt.create_stream()
        for _ in range(3):
            assert acl.mdl.execute(model_id, inputs, outputs) == 0
            assert acl.mdl.execute_async(model_id, inputs, outputs, stream) == 0
        assert acl.rt.synchronize_stream(stream) == 0
        out = bytearray(16)
        assert (
            acl.rt.memcpy(out, 16, acl.get_data_buffer_addr(acl.mdl.get_dataset_buffer(outputs, 2)), 16, 2)
            == 0
        )
        assert np.frombuffer(out, "<f4").tolist() == [1, 4, 9, 16]
        assert acl.mdl.set_dynamic_batch_size(model_id, inputs, 1, 2) == codes.ACL_ERROR_MODEL_NOT_DYNAMIC
        assert acl.mdl.unload(model_id) == 0
        assert acl.mdl.unload(model_id) == codes.ACL_ERROR_INVALID_MODEL_ID
        assert acl.mdl.destroy_desc(desc) == 0 and acl.mdl.destroy_dataset(inputs) == 0
    finally:
        assert acl.finalize() == 0
