"""The one table of the C surface (libascendcl/api/acl_api.json) and what is generated from it.

The generated files are fresh; every served row is defined in the file it names; a malformed row is
refused naming the row and the field; libascendcl.so exports exactly the table's exported
functions; a program taking the address of each links, loads with LD_BIND_NOW=1, and every stub it
calls answers its kind's failure with a message naming it; the 89 ACL functions torch_npu links
resolve; every header builds alone and with the others as C11 and C++17 with warnings as errors
and -pedantic.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from flexnpu_testing import clibrary
from tests.c.conftest import api_generator

INCLUDE = clibrary.LIBRARY_DIR / "include"
HEADERS = sorted(p.relative_to(INCLUDE).as_posix() for p in (INCLUDE / "acl").rglob("*.h"))

# torch_npu's linked ACL functions: the stub list of Ascend/pytorch third_party/acl/libs/acl.cpp
# (v2.9.0-26.0.0 and master list the same 89), written down from reading that file.
TORCH_NPU = [
    "aclAppLog",
    "aclCreateDataBuffer",
    "aclCreateTensorDesc",
    "aclDestroyDataBuffer",
    "aclDestroyTensorDesc",
    "aclFinalize",
    "aclGetTensorDescDim",
    "aclGetTensorDescDimV2",
    "aclGetTensorDescFormat",
    "aclGetTensorDescName",
    "aclGetTensorDescNumDims",
    "aclGetTensorDescType",
    "aclInit",
    "aclSetTensorDescName",
    "aclSetTensorFormat",
    "aclSetTensorPlaceMent",
    "aclSetTensorShape",
    "aclSetTensorShapeRange",
    "aclmdlFinalizeDump",
    "aclmdlInitDump",
    "aclmdlRIDebugJsonPrint",
    "aclmdlSetDump",
    "aclopCreateAttr",
    "aclopDestroyAttr",
    "aclopSetAttrBool",
    "aclopSetAttrDataType",
    "aclopSetAttrFloat",
    "aclopSetAttrInt",
    "aclopSetAttrListBool",
    "aclopSetAttrListFloat",
    "aclopSetAttrListInt",
    "aclopSetAttrString",
    "aclrtCmoAsync",
    "aclrtCreateEvent",
    "aclrtCreateEventExWithFlag",
    "aclrtCreateEventWithFlag",
    "aclrtCreateStream",
    "aclrtCreateStreamWithConfig",
    "aclrtDestroyEvent",
    "aclrtDestroyStream",
    "aclrtDestroyStreamForce",
    "aclrtDeviceCanAccessPeer",
    "aclrtDeviceTaskAbort",
    "aclrtEventElapsedTime",
    "aclrtFree",
    "aclrtFreeHost",
    "aclrtGetDevice",
    "aclrtGetDeviceCount",
    "aclrtGetDeviceResLimit",
    "aclrtGetDeviceUtilizationRate",
    "aclrtGetErrorVerbose",
    "aclrtGetLastError",
    "aclrtGetMemInfo",
    "aclrtGetMemUceInfo",
    "aclrtGetResInCurrentThread",
    "aclrtGetStreamResLimit",
    "aclrtIpcGetEventHandle",
    "aclrtIpcOpenEventHandle",
    "aclrtMalloc",
    "aclrtMallocAlign32",
    "aclrtMallocHost",
    "aclrtMemUceRepair",
    "aclrtMemcpy",
    "aclrtMemcpyAsync",
    "aclrtMemcpyAsyncWithCondition",
    "aclrtPeekAtLastError",
    "aclrtQueryEvent",
    "aclrtQueryEventStatus",
    "aclrtRecordEvent",
    "aclrtRepairError",
    "aclrtResetDevice",
    "aclrtResetDeviceResLimit",
    "aclrtResetEvent",
    "aclrtResetStreamResLimit",
    "aclrtSetDevice",
    "aclrtSetDeviceResLimit",
    "aclrtSetDeviceSatMode",
    "aclrtSetExceptionInfoCallback",
    "aclrtSetOpWaitTimeout",
    "aclrtSetStreamFailureMode",
    "aclrtSetStreamResLimit",
    "aclrtStreamQuery",
    "aclrtStreamWaitEvent",
    "aclrtSynchronizeDevice",
    "aclrtSynchronizeEvent",
    "aclrtSynchronizeStream",
    "aclrtSynchronizeStreamWithTimeout",
    "aclrtUnuseStreamResInCurrentThread",
    "aclrtUseStreamResInCurrentThread",
]


@pytest.fixture(scope="module")
def api() -> ModuleType:
    return api_generator()


def _exported_symbols(library: Path) -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[-1] for line in out.splitlines() if line.split()[1] in ("T", "W")}


def test_generated_files_are_fresh(api: ModuleType) -> None:
    assert api.main(["--check"]) == 0, "run python3 libascendcl/api/generate.py"


def test_served_rows_are_defined_in_the_files_they_name(api: ModuleType) -> None:
    rows = api.load()
    assert api.undefined(rows) == []
    served = [r for r in rows if r.serve in ("remote", "host")]
    assert len(served) > 100 and {r.file for r in served} >= {"memory.c", "tensor.c", "dataset.c", "opattr.c"}


def _one_row(**changes: Any) -> dict[str, Any]:
    row = {"name": "aclrtFree", "header": "acl_rt.h", "family": "memory", "serve": "remote", "file": "memory.c",
           "returns": "error", "proto": "aclError aclrtFree(void *devPtr)"}  # fmt: skip
    row.update(changes)
    return {k: v for k, v in row.items() if v is not None}


MALFORMED = [
    pytest.param(_one_row(serve="served"), "field serve", id="unknown-serve"),
    pytest.param(_one_row(returns="int"), "field returns", id="unknown-returns"),
    pytest.param(_one_row(returns="pointer"), "field returns must be error", id="returns-disagrees"),
    pytest.param(_one_row(file=None), "field file", id="remote-without-file"),
    pytest.param(_one_row(file="../x.c"), "field file", id="file-outside-src"),
    pytest.param(_one_row(serve="stub"), "field file", id="stub-with-file"),
    pytest.param(_one_row(serve="library", file=None), "field library", id="library-without-name"),
    pytest.param(
        _one_row(proto="aclError aclrtMalloc(void *devPtr)"), "field proto", id="proto-names-another"
    ),
    pytest.param(_one_row(header="acl_nowhere.h"), "field header", id="unknown-header"),
    pytest.param(_one_row(extra=1), "unknown field", id="unknown-field"),
    pytest.param(_one_row(name=""), "field name", id="empty-name"),
    pytest.param(
        _one_row(serve="stub", file=None, returns="value", proto="size_t aclrtFree(void *devPtr)"),
        "field fail",
        id="value-stub-without-fail",
    ),
]


@pytest.mark.parametrize(("row", "text"), MALFORMED)
def test_a_malformed_row_is_refused_naming_the_row_and_the_field(
    api: ModuleType, tmp_path: Path, row: dict[str, Any], text: str
) -> None:
    table = tmp_path / "acl_api.json"
    table.write_text(json.dumps({"format": 1, "functions": [row]}))
    with pytest.raises(api.TableError, match="row 0") as err:
        api.load(table)
    assert text in str(err.value)


def test_a_repeated_name_is_refused(api: ModuleType, tmp_path: Path) -> None:
    table = tmp_path / "acl_api.json"
    table.write_text(json.dumps({"format": 1, "functions": [_one_row(), _one_row()]}))
    with pytest.raises(api.TableError, match=r"row 1 .*field name repeats aclrtFree"):
        api.load(table)


def test_the_library_exports_exactly_the_tables_functions(api: ModuleType, library: Path) -> None:
    rows = api.load()
    assert _exported_symbols(library) == {r.name for r in rows if r.exported} | set(api.FLEXNPU_EXPORTS)
    declared_elsewhere = {r.name for r in rows if r.serve == "library"}
    assert len(declared_elsewhere) > 200  # dvpp, tdt, profiling, op compiler, cblas: declared only


def test_every_function_resolves_with_bind_now_and_every_stub_refuses(
    api: ModuleType, library: Path, tmp_path: Path
) -> None:
    rows = api.load()
    source = tmp_path / "every_symbol.c"
    source.write_text(api.calls_c(rows))
    exe = clibrary.compile_program(source, link_library=library)
    res = subprocess.run(
        [str(exe)], capture_output=True, text=True, timeout=60, env={"LD_BIND_NOW": "1"}, check=False
    )
    lines = res.stdout.splitlines()
    assert lines[0] == f"exported {sum(r.exported for r in rows)}", res.stderr
    verdicts = dict(line.split(" ", 1) for line in lines[1:])
    stubs = [r.name for r in rows if r.serve == "stub"]
    assert sorted(verdicts) == sorted(stubs)
    assert [v for v in verdicts.items() if not v[1].startswith("ok")] == []
    assert res.returncode == 0


def test_torch_npus_linked_functions_all_resolve(library: Path) -> None:
    assert len(TORCH_NPU) == len(set(TORCH_NPU)) == 89
    assert sorted(set(TORCH_NPU) - _exported_symbols(library)) == []


def _build(source: str, lang: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    src = tmp_path / ("h.c" if lang == "c11" else "h.cc")
    src.write_text(source)
    compiler = ["cc", "-std=c11"] if lang == "c11" else ["c++", "-std=c++17"]
    return subprocess.run(
        [*compiler, "-Wall", "-Wextra", "-Werror", "-pedantic", "-DENABLE_DVPP_INTERFACE", f"-I{INCLUDE}",
         "-fsyntax-only", str(src)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("lang", ["c11", "c++17"])
def test_every_header_builds_alone(lang: str, tmp_path: Path) -> None:
    failed = {}
    for header in HEADERS:
        res = _build(f'#include "{header}"\n', lang, tmp_path)
        if res.returncode:
            failed[header] = res.stderr[:2000]
    assert failed == {}
    assert len(HEADERS) >= 18


@pytest.mark.parametrize("lang", ["c11", "c++17"])
def test_all_headers_build_together_in_both_orders(lang: str, tmp_path: Path) -> None:
    for order in (HEADERS, HEADERS[::-1]):
        res = _build("".join(f'#include "{h}"\n' for h in order), lang, tmp_path)
        assert res.returncode == 0, res.stderr[:3000]


def test_the_dvpp_header_needs_its_macro_as_cann_s_does(tmp_path: Path) -> None:
    src = tmp_path / "dvpp.c"
    src.write_text('#include "acl/ops/acl_dvpp.h"\n')
    res = subprocess.run(
        ["cc", f"-I{INCLUDE}", "-fsyntax-only", str(src)], capture_output=True, text=True, check=False
    )
    assert res.returncode != 0 and "ENABLE_DVPP_INTERFACE" in res.stderr


def test_every_value_has_canns_number(tmp_path: Path) -> None:
    """The 1,065 numeric names of CANN's ACL headers (enumerators, macros, error codes) against ours."""
    values: dict[str, int] = json.loads((Path(__file__).with_name("cann_values.json")).read_text())["values"]
    includes = "".join(f'#include "{h}"\n' for h in HEADERS if h != "acl/flexnpu_kernel.h")
    prints = "".join(
        f'    printf("{name} %llu\\n", (unsigned long long)({name}));\n' for name in sorted(values)
    )
    source = tmp_path / "values.c"
    source.write_text(
        f'{includes}#include <stdio.h>\n#pragma GCC diagnostic ignored "-Wdeprecated-declarations"\n'
        f"int main(void)\n{{\n{prints}    return 0;\n}}\n"
    )
    exe = clibrary.compile_program(source, extra_flags=["-DENABLE_DVPP_INTERFACE"], out_dir=tmp_path)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True, timeout=60).stdout
    ours = {name: int(value) for name, value in (line.split() for line in out.splitlines())}
    mask = (1 << 64) - 1
    assert {n: v for n, v in values.items() if ours[n] != v & mask} == {}
    assert len(values) > 1000
