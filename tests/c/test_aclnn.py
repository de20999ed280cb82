"""The share's aclnn libraries (issue 24 item 3): libopapi.so and libnnopbase.so built from
api/aclnn_api.json, the host-side objects and executors of a real C program, and the exports."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from flexnpu_testing import clibrary
from tests.c.conftest import HERE, Claim, run

BUILD = clibrary.LIBRARY_DIR / "build"


def _generator():  # type: ignore[no-untyped-def]
    path = clibrary.LIBRARY_DIR / "api" / "generate_aclnn.py"
    spec = importlib.util.spec_from_file_location("aclnn_generate", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _exports(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in out.stdout.splitlines() if line.split()[1:2] == ["T"]}


@pytest.fixture(scope="module")
def aclnn_objects(library: Path) -> Path:
    return clibrary.compile_program(
        HERE / "aclnn_objects.c",
        link_library=library,
        extra_flags=[f"-L{library.parent}", "-Wl,--no-as-needed", "-lopapi"],
    )


def test_the_generated_files_are_current() -> None:
    assert _generator().main(["--check"]) == 0


def test_libopapi_exports_the_table_and_the_objects(library: Path) -> None:
    functions = _generator().load()
    wanted = {n for f in functions for n in (f.name, f.name + "GetWorkspaceSize")}
    exported = _exports(library.parent / "libopapi.so")
    objects = _exports(library.parent / "libnnopbase.so")
    assert wanted <= exported
    assert exported - wanted == objects  # nothing else: the objects and the builder
    assert {"aclCreateTensor", "aclCreateScalar", "aclCreateIntArray", "aclCreateFloatArray", "aclCreateBoolArray",
            "aclCreateTensorList", "aclDestroyAclOpExecutor", "aclnnInit", "aclGetViewShape"} <= objects  # fmt: skip
    for name in ("ops_infer", "ops_train", "math", "sparse", "fft", "rand"):
        assert not any(s.startswith("aclnn") for s in _exports(library.parent / f"libaclnn_{name}.so"))


def test_host_side_objects_and_executors(aclnn_objects: Path) -> None:
    res = run(aclnn_objects, conf=None, LD_LIBRARY_PATH=str(BUILD)).ok()
    assert res.values["failures"] == "0"
    assert "aclnnAddGetWorkspaceSize: other is NULL" in res.stderr  # the refusal names the parameter


@pytest.fixture(scope="module")
def aclnn_launch(library: Path) -> Path:
    return clibrary.compile_program(
        HERE / "aclnn_launch.c",
        link_library=library,
        extra_flags=[f"-L{library.parent}", "-Wl,--no-as-needed", "-lopapi", "-lm"],
    )


def test_aclnn_functions_run_on_the_share_in_stream_order(aclnn_launch: Path, claim: Claim) -> None:
    res = run(aclnn_launch, conf=claim.conf, LD_LIBRARY_PATH=str(BUILD)).ok()
    assert res.values["mismatch_code"] == "100021"
    assert res.stdout.count("\nok ") >= 20 and "FAIL" not in res.stdout, res.stdout


def test_aclnn_objects_are_sanitizer_clean() -> None:
    lib = clibrary.build_library(sanitized=True)
    exe = clibrary.compile_program(
        HERE / "aclnn_objects.c",
        link_library=lib,
        extra_flags=[*clibrary.SANITIZERS, "-g", f"-L{lib.parent}", "-Wl,--no-as-needed", "-lopapi"],
        out_dir=lib.parent,
    )
    res = run(exe, conf=None, LD_LIBRARY_PATH=str(lib.parent), ASAN_OPTIONS="detect_leaks=1:abort_on_error=0")
    assert res.rc == 0 and not res.failures, res.stdout[-3000:] + res.stderr[-3000:]
    assert "ERROR: " not in res.stderr and "runtime error" not in res.stderr, res.stderr[-3000:]


@pytest.mark.parametrize(
    ("row", "words"),
    [
        pytest.param(
            {
                "name": "aclnnFoo",
                "header": "aclnn_foo.h",
                "params": [{"name": "x", "kind": "blob", "ctype": "int"}],
            },
            "params[0].kind 'blob'",
            id="unknown-kind",
        ),
        pytest.param(
            {
                "name": "aclnnFoo",
                "header": "aclnn_foo.h",
                "params": [{"name": "x", "kind": "scalar", "ctype": "double"}],
            },
            "params[0].ctype 'double' does not fit kind 'scalar'",
            id="ctype",
        ),
        pytest.param({"name": "foo", "header": "aclnn_foo.h", "params": []}, "name must be", id="name"),
        pytest.param(
            {"name": "aclnnFoo", "header": "../x.h", "params": []}, "header must be", id="header-path"
        ),
        pytest.param(
            {"name": "aclnnFoo", "header": "aclnn_foo.h", "params": [], "serve": 1},
            "fields must be",
            id="extra-field",
        ),
    ],
)
def test_a_bad_table_row_is_refused_naming_row_and_field(
    tmp_path: Path, row: dict[str, object], words: str
) -> None:
    gen = _generator()
    table = tmp_path / "aclnn_api.json"
    table.write_text(json.dumps({"format": 1, "functions": [row]}))
    with pytest.raises(gen.TableError) as info:
        gen.load(table)
    assert "row 0" in str(info.value) and words in str(info.value)


@pytest.mark.parametrize(("compiler", "std"), [("cc", "-std=c11"), ("c++", "-std=c++17")])
def test_every_aclnn_header_builds_alone_and_together(tmp_path: Path, compiler: str, std: str) -> None:
    include = clibrary.LIBRARY_DIR / "include"
    headers = [
        "aclnn/acl_meta.h",
        "aclnn/aclnn_base.h",
        *sorted(f"aclnnop/{p.name}" for p in (include / "aclnnop").glob("aclnn_*.h")),
    ]
    for name in [*headers, None]:  # each alone, then all of them in one unit
        src = tmp_path / ("unit.cc" if compiler == "c++" else "unit.c")
        src.write_text(
            "".join(f"#include <{h}>\n" for h in (headers if name is None else [name]))
            + "int main(void) { return 0; }\n"
        )
        res = subprocess.run(
            [compiler, std, "-Wall", "-Wextra", "-Werror", "-pedantic", f"-I{include}", "-c", str(src), "-o",
             str(tmp_path / "unit.o")],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert res.returncode == 0, f"{name or 'all'}: {res.stderr[-2000:]}"


def _compare():  # type: ignore[no-untyped-def]
    path = clibrary.LIBRARY_DIR / "api" / "compare_aclnn.py"
    spec = importlib.util.spec_from_file_location("aclnn_compare", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cann_comparison_finds_a_changed_parameter(tmp_path: Path) -> None:
    """compare_aclnn.py against our own headers finds nothing; against one with a parameter retyped, that one."""
    include = clibrary.LIBRARY_DIR / "include" / "aclnnop"
    compare = _compare()
    assert compare.differences(include) == []
    for header in include.glob("aclnn_*.h"):
        (tmp_path / header.name).write_text(header.read_text())
    softmax = tmp_path / "aclnn_softmax.h"
    softmax.write_text(softmax.read_text().replace("int64_t dim", "int32_t dim"))
    (tmp_path / "aclnn_silu.h").unlink()
    diffs = compare.differences(tmp_path)
    assert len(diffs) == 2, diffs
    assert any(d.startswith("aclnnSoftmax: ") and "int32_t" in d for d in diffs)
    assert any(d.startswith("aclnnSilu: no header") for d in diffs)
