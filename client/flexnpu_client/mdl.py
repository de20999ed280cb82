"""``acl.mdl``: models in the pyACL shape (outputs first, ``ret`` last), plus their host-side objects.

Usage::

    model_id, ret = acl.mdl.load_from_file("resnet.fnm")
    desc = acl.mdl.create_desc(); ret = acl.mdl.get_desc(desc, model_id)
    size = acl.mdl.get_input_size_by_index(desc, 0)
    inputs = acl.mdl.create_dataset()
    _, ret = acl.mdl.add_dataset_buffer(inputs, acl.create_data_buffer(dev_ptr, size))
    ret = acl.mdl.execute(model_id, inputs, outputs)       # or execute_async(..., stream)
    ret = acl.mdl.unload(model_id)

A model's bytes go to the aclserver (which cannot see the container's files); descriptions,
datasets, data buffers and config handles live here and cost no round trip. Queries of a
description answer from the one copy ``get_desc`` fetched.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Any

from flexnpu_client import _state
from flexnpu_client.errors import AclError
from flexnpu_wire import modelfile
from flexnpu_wire.codes import (
    ACL_ERROR_INVALID_PARAM,
    ACL_ERROR_MODEL_NOT_DYNAMIC,
    MemcpyKind,
)

__all__ = [
    "MDL_LOAD_FROM_FILE",
    "MDL_LOAD_FROM_FILE_WITH_MEM",
    "MDL_LOAD_FROM_MEM",
    "MDL_LOAD_FROM_MEM_WITH_MEM",
    "ConfigHandle",
    "DataBuffer",
    "Dataset",
    "ModelDesc",
    "add_dataset_buffer",
    "create_config_handle",
    "create_data_buffer",
    "create_dataset",
    "create_desc",
    "destroy_config_handle",
    "destroy_data_buffer",
    "destroy_dataset",
    "destroy_desc",
    "execute",
    "execute_async",
    "get_data_buffer_addr",
    "get_data_buffer_size_v2",
    "get_dataset_buffer",
    "get_dataset_num_buffers",
    "get_desc",
    "get_desc_from_file",
    "get_dynamic_batch",
    "get_dynamic_hw",
    "get_input_data_type",
    "get_input_dims",
    "get_input_format",
    "get_input_index_by_name",
    "get_input_name_by_index",
    "get_input_size_by_index",
    "get_num_inputs",
    "get_num_outputs",
    "get_output_data_type",
    "get_output_dims",
    "get_output_format",
    "get_output_index_by_name",
    "get_output_name_by_index",
    "get_output_size_by_index",
    "load_from_file",
    "load_from_file_with_mem",
    "load_from_mem",
    "load_from_mem_with_mem",
    "load_with_config",
    "query_size",
    "query_size_from_mem",
    "set_config_opt",
    "set_dynamic_batch_size",
    "set_dynamic_hw_size",
    "unload",
]

MDL_LOAD_FROM_FILE, MDL_LOAD_FROM_FILE_WITH_MEM, MDL_LOAD_FROM_MEM, MDL_LOAD_FROM_MEM_WITH_MEM = 1, 2, 3, 4
"""CANN's ACL_MDL_LOAD_* values for the ``ACL_MDL_LOAD_TYPE_SIZET`` config option."""
_CONFIG_ATTRS = {0: "priority", 1: "load_type", 2: "path", 3: "mem", 4: "mem_size", 5: "weight", 6: "weight_size",
                 7: "work", 8: "work_size"}  # fmt: skip
"""aclmdlConfigAttr values ``load_with_config`` honours (ACL_MDL_PRIORITY_INT32 .. ACL_MDL_WORKSPACE_SIZET)."""


@dataclass(eq=False)
class DataBuffer:
    """aclDataBuffer: a device pointer and a size (host-side, no quota)."""

    addr: int
    size: int


@dataclass(eq=False)
class Dataset:
    """aclmdlDataset: the buffers of one execution's inputs or outputs."""

    buffers: list[DataBuffer] = field(default_factory=list)


@dataclass(eq=False)
class ModelDesc:
    """aclmdlDesc: filled by ``get_desc`` from the aclserver's one copy."""

    model: modelfile.ModelFile | None = None


@dataclass(eq=False)
class ConfigHandle:
    """aclmdlConfigHandle: the options of ``load_with_config``."""

    options: dict[str, Any] = field(default_factory=dict)


def _session() -> Any:
    return _state.current()


def _mem(model: Any, size: int) -> Any:
    """A model in memory: a buffer (its first ``size`` bytes) or a malloc_host pointer."""
    if isinstance(model, int):
        return (model, size)
    return memoryview(model).cast("B")[:size]


# -- load and unload ----------------------------------------------------------------------------


def load_from_file(model_path: str) -> tuple[int, int]:
    return _state.value_and_ret(lambda: _session().load_model(os.fspath(model_path)), 0)


def load_from_mem(model: Any, model_size: int) -> tuple[int, int]:
    return _state.value_and_ret(lambda: _session().load_model(_mem(model, model_size)), 0)


def load_from_file_with_mem(
    model_path: str, work_ptr: int, work_size: int, weight_ptr: int, weight_size: int
) -> tuple[int, int]:
    return _state.value_and_ret(
        lambda: _session().load_model(
            os.fspath(model_path), weight=(weight_ptr, weight_size), work=(work_ptr, work_size)
        ),
        0,
    )


def load_from_mem_with_mem(  # noqa: PLR0917 - positional like pyACL
    model: Any, model_size: int, work_ptr: int, work_size: int, weight_ptr: int, weight_size: int
) -> tuple[int, int]:
    return _state.value_and_ret(
        lambda: _session().load_model(
            _mem(model, model_size), weight=(weight_ptr, weight_size), work=(work_ptr, work_size)
        ),
        0,
    )


def create_config_handle() -> ConfigHandle:
    return ConfigHandle()


def destroy_config_handle(handle: ConfigHandle) -> int:
    return 0 if isinstance(handle, ConfigHandle) else ACL_ERROR_INVALID_PARAM


def set_config_opt(handle: ConfigHandle, attr: int, value: Any) -> int:
    """aclmdlSetConfigOpt for the attributes ``load_with_config`` understands."""
    if not isinstance(handle, ConfigHandle) or attr not in _CONFIG_ATTRS:
        _state.last_error = f"config attribute {attr} is not supported (known: {sorted(_CONFIG_ATTRS)})"
        return ACL_ERROR_INVALID_PARAM
    handle.options[_CONFIG_ATTRS[attr]] = value
    return 0


def load_with_config(handle: ConfigHandle) -> tuple[int, int]:
    """aclmdlLoadWithConfig: the load type and its path or memory, weight and work from ``handle``."""

    def load() -> int:
        opts = handle.options
        kind = opts.get("load_type")
        if kind in (MDL_LOAD_FROM_FILE, MDL_LOAD_FROM_FILE_WITH_MEM):
            data: Any = os.fspath(opts["path"])
        elif kind in (MDL_LOAD_FROM_MEM, MDL_LOAD_FROM_MEM_WITH_MEM):
            data = _mem(opts["mem"], int(opts["mem_size"]))
        else:
            raise AclError(ACL_ERROR_INVALID_PARAM, f"load type {kind!r} is not one of 1..4 (ACL_MDL_LOAD_*)")
        if kind in (MDL_LOAD_FROM_FILE_WITH_MEM, MDL_LOAD_FROM_MEM_WITH_MEM):
            weight = (int(opts.get("weight", 0)), int(opts.get("weight_size", 0)))
            work = (int(opts.get("work", 0)), int(opts.get("work_size", 0)))
            return int(_session().load_model(data, weight=weight, work=work))
        return int(_session().load_model(data))

    return _state.value_and_ret(load, 0)


def unload(model_id: int) -> int:
    return _state.ret_of(lambda: _session().unload_model(model_id))


def query_size(model_path: str) -> tuple[int, int, int]:
    (work, weight), ret = _state.value_and_ret(
        lambda: _session().query_model_size(os.fspath(model_path)), (0, 0)
    )
    return work, weight, ret


def query_size_from_mem(model: Any, model_size: int) -> tuple[int, int, int]:
    (work, weight), ret = _state.value_and_ret(
        lambda: _session().query_model_size(_mem(model, model_size)), (0, 0)
    )
    return work, weight, ret


# -- descriptions -------------------------------------------------------------------------------


def create_desc() -> ModelDesc:
    return ModelDesc()


def destroy_desc(desc: ModelDesc) -> int:
    return 0 if isinstance(desc, ModelDesc) else ACL_ERROR_INVALID_PARAM


def get_desc(desc: ModelDesc, model_id: int) -> int:
    def fill() -> None:
        desc.model = _session().model_desc(model_id)

    return _state.ret_of(fill)


def get_desc_from_file(desc: ModelDesc, model_path: str) -> int:
    def fill() -> None:
        desc.model = _session().query_model_desc(os.fspath(model_path))

    return _state.ret_of(fill)


def _described(desc: ModelDesc) -> modelfile.ModelFile:
    if not isinstance(desc, ModelDesc) or desc.model is None:
        raise AclError(
            ACL_ERROR_INVALID_PARAM, "the model description is empty (call acl.mdl.get_desc first)"
        )
    return desc.model


def get_num_inputs(desc: ModelDesc) -> int:
    return _state.value_and_ret(lambda: len(_described(desc).inputs), 0)[0]


def get_num_outputs(desc: ModelDesc) -> int:
    return _state.value_and_ret(lambda: len(_described(desc).outputs), 0)[0]


def _tensor(desc: ModelDesc, index: int, output: bool) -> modelfile.Tensor:
    model = _described(desc)
    tensors = [o.tensor for o in model.outputs] if output else list(model.inputs)
    if not 0 <= index < len(tensors):
        raise AclError(
            ACL_ERROR_INVALID_PARAM, f"{'output' if output else 'input'} index {index} is out of range"
        )
    return tensors[index]


def _size(desc: ModelDesc, index: int, output: bool) -> int:
    model = _described(desc)
    _tensor(desc, index, output)
    return model.output_size(index) if output else model.input_size(index)


def get_input_size_by_index(desc: ModelDesc, index: int) -> int:
    return _state.value_and_ret(lambda: _size(desc, index, False), 0)[0]


def get_output_size_by_index(desc: ModelDesc, index: int) -> int:
    return _state.value_and_ret(lambda: _size(desc, index, True), 0)[0]


def _dims(desc: ModelDesc, index: int, output: bool) -> dict[str, Any]:
    t = _tensor(desc, index, output)
    return {"name": t.name, "dimCount": len(t.dims), "dims": list(t.dims)}


def get_input_dims(desc: ModelDesc, index: int) -> tuple[dict[str, Any], int]:
    return _state.value_and_ret(lambda: _dims(desc, index, False), {})


def get_output_dims(desc: ModelDesc, index: int) -> tuple[dict[str, Any], int]:
    return _state.value_and_ret(lambda: _dims(desc, index, True), {})


def get_input_name_by_index(desc: ModelDesc, index: int) -> str:
    return _state.value_and_ret(lambda: _tensor(desc, index, False).name, "")[0]


def get_output_name_by_index(desc: ModelDesc, index: int) -> str:
    return _state.value_and_ret(lambda: _tensor(desc, index, True).name, "")[0]


def get_input_format(desc: ModelDesc, index: int) -> int:
    return _state.value_and_ret(lambda: _tensor(desc, index, False).format, -1)[0]


def get_output_format(desc: ModelDesc, index: int) -> int:
    return _state.value_and_ret(lambda: _tensor(desc, index, True).format, -1)[0]


def get_input_data_type(desc: ModelDesc, index: int) -> int:
    return _state.value_and_ret(lambda: _tensor(desc, index, False).data_type, -1)[0]


def get_output_data_type(desc: ModelDesc, index: int) -> int:
    return _state.value_and_ret(lambda: _tensor(desc, index, True).data_type, -1)[0]


def _index_by_name(desc: ModelDesc, name: str, output: bool) -> int:
    model = _described(desc)
    names = [o.tensor.name for o in model.outputs] if output else [t.name for t in model.inputs]
    if name not in names:
        raise AclError(
            ACL_ERROR_INVALID_PARAM, f"the model has no {'output' if output else 'input'} named {name!r}"
        )
    return names.index(name)


def get_input_index_by_name(desc: ModelDesc, name: str) -> tuple[int, int]:
    return _state.value_and_ret(lambda: _index_by_name(desc, name, False), 0)


def get_output_index_by_name(desc: ModelDesc, name: str) -> tuple[int, int]:
    return _state.value_and_ret(lambda: _index_by_name(desc, name, True), 0)


def get_dynamic_batch(desc: ModelDesc) -> tuple[dict[str, Any], int]:
    def batch() -> dict[str, Any]:
        gears = list(_described(desc).batch_gears)
        return {"batchCount": len(gears), "batch": gears}

    return _state.value_and_ret(batch, {})


def get_dynamic_hw(desc: ModelDesc, index: int) -> tuple[dict[str, Any], int]:
    def hw() -> dict[str, Any]:
        gears = [list(g) for g in _described(desc).hw_gears]
        return {"hwCount": len(gears), "hw": gears}

    return _state.value_and_ret(hw, {})


# -- datasets and data buffers -------------------------------------------------------------------


def create_data_buffer(data: int, size: int) -> DataBuffer:
    return DataBuffer(int(data), int(size))


def destroy_data_buffer(data_buffer: DataBuffer) -> int:
    return 0 if isinstance(data_buffer, DataBuffer) else ACL_ERROR_INVALID_PARAM


def get_data_buffer_addr(data_buffer: DataBuffer) -> int:
    return data_buffer.addr if isinstance(data_buffer, DataBuffer) else 0


def get_data_buffer_size_v2(data_buffer: DataBuffer) -> int:
    return data_buffer.size if isinstance(data_buffer, DataBuffer) else 0


def create_dataset() -> Dataset:
    return Dataset()


def destroy_dataset(dataset: Dataset) -> int:
    return 0 if isinstance(dataset, Dataset) else ACL_ERROR_INVALID_PARAM


def add_dataset_buffer(dataset: Dataset, data_buffer: DataBuffer) -> tuple[Dataset | None, int]:
    if not isinstance(dataset, Dataset) or not isinstance(data_buffer, DataBuffer):
        _state.last_error = "add_dataset_buffer takes a dataset and a data buffer"
        return None, ACL_ERROR_INVALID_PARAM
    dataset.buffers.append(data_buffer)
    return dataset, 0


def get_dataset_num_buffers(dataset: Dataset) -> int:
    return len(dataset.buffers) if isinstance(dataset, Dataset) else 0


def get_dataset_buffer(dataset: Dataset, index: int) -> DataBuffer | None:
    if isinstance(dataset, Dataset) and 0 <= index < len(dataset.buffers):
        return dataset.buffers[index]
    return None


# -- execution ----------------------------------------------------------------------------------


def _pairs(dataset: Dataset, what: str) -> list[tuple[int, int]]:
    if not isinstance(dataset, Dataset):
        raise AclError(ACL_ERROR_INVALID_PARAM, f"the {what} is not a dataset")
    return [(b.addr, b.size) for b in dataset.buffers]


def execute(model_id: int, input: Dataset, output: Dataset) -> int:
    return _state.ret_of(
        lambda: _session().execute_model(model_id, _pairs(input, "input"), _pairs(output, "output"))
    )


def execute_async(model_id: int, input: Dataset, output: Dataset, stream: int) -> int:
    if not stream:
        _state.last_error = "execute_async needs a stream (acl.rt.create_stream)"
        return ACL_ERROR_INVALID_PARAM
    return _state.ret_of(
        lambda: _session().execute_model(model_id, _pairs(input, "input"), _pairs(output, "output"), stream)
    )


def _set_dynamic(model_id: int, dataset: Dataset, index: int, values: tuple[int, ...]) -> None:
    session = _session()
    desc = session.model_desc(model_id)
    want = desc.dynamic_index()
    if want is None or bool(desc.batch_gears) != (len(values) == 1):
        raise AclError(ACL_ERROR_MODEL_NOT_DYNAMIC, f"model {model_id} has no such dynamic gears")
    if index != want or not 0 <= index < len(dataset.buffers):
        raise AclError(ACL_ERROR_INVALID_PARAM, f"input {index} is not the model's dynamic input ({want})")
    buf = dataset.buffers[index]
    raw = struct.pack(f"<{len(values)}Q", *values)
    session.memcpy(buf.addr, buf.size, raw, len(raw), MemcpyKind.HOST_TO_DEVICE)


def set_dynamic_batch_size(model_id: int, dataset: Dataset, index: int, batch_size: int) -> int:
    """aclmdlSetDynamicBatchSize: writes the batch into the dataset's dynamic-shape input."""
    return _state.ret_of(lambda: _set_dynamic(model_id, dataset, index, (batch_size,)))


def set_dynamic_hw_size(model_id: int, dataset: Dataset, index: int, height: int, width: int) -> int:
    """aclmdlSetDynamicHWSize: writes (height, width) into the dataset's dynamic-shape input."""
    return _state.ret_of(lambda: _set_dynamic(model_id, dataset, index, (height, width)))
