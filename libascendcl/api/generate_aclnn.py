"""``python3 libascendcl/api/generate_aclnn.py [--check]``: the share's aclnn surface from its table.

``aclnn_api.json`` (beside this file) lists every aclnn function the share's ``libopapi.so`` exports:
its name (without ``GetWorkspaceSize``), CANN's header for it, and its parameters in order, each with
CANN's name, its C type as CANN's header spells it, and its kind (how the launch sends it; the kinds
are those of ``flexnpu_runtime/aclserver/operators/aclnn.py``, which computes the functions). From it
this script writes:

- ``include/aclnnop/aclnn_*.h``: each header's functions, ``aclnnXxxGetWorkspaceSize(params…,
  uint64_t *workspaceSize, aclOpExecutor **executor)`` and ``aclnnXxx(void *workspace, uint64_t
  workspaceSize, aclOpExecutor *executor, aclrtStream stream)``, as CANN's;
- ``closure/aclnn_functions.c``: their definitions, over the executor builder of ``closure/nnopbase.c``
  (``libopapi.so`` is built from both, ``libnnopbase.so`` from the builder alone: api/closure.json).

A function torch_npu looks up that the table lacks is simply not exported (torch_npu then takes the
aclop path for that operator). ``--check`` writes nothing and exits 1 when a generated file is stale.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "api" / "aclnn_api.json"
HEADERS = ROOT / "include" / "aclnnop"
CLOSURE = ROOT / "closure"

KINDS = {
    # kind: (allowed C types, the builder call with {p} the parameter)
    "tensor": ({"const aclTensor *", "aclTensor *"}, 'flexnpu_opapi_tensor(e, "{p}", {p}, 0, 0);'),
    "tensor?": ({"const aclTensor *", "aclTensor *"}, 'flexnpu_opapi_tensor(e, "{p}", {p}, 1, 0);'),
    "out": ({"const aclTensor *", "aclTensor *"}, 'flexnpu_opapi_tensor(e, "{p}", {p}, 0, 1);'),
    "out?": ({"const aclTensor *", "aclTensor *"}, 'flexnpu_opapi_tensor(e, "{p}", {p}, 1, 1);'),
    "inout": ({"const aclTensor *", "aclTensor *"}, 'flexnpu_opapi_tensor(e, "{p}", {p}, 0, 1);'),
    "tensors": ({"const aclTensorList *"}, 'flexnpu_opapi_tensor_list(e, "{p}", {p});'),
    "scalar": ({"const aclScalar *"}, 'flexnpu_opapi_scalar(e, "{p}", {p});'),
    "int": (
        {"int64_t", "int8_t", "int32_t", "int", "uint64_t"},
        'flexnpu_opapi_int(e, "{p}", (int64_t){p});',
    ),
    "dtype": ({"aclDataType", "const aclDataType"}, 'flexnpu_opapi_int(e, "{p}", (int64_t){p});'),
    "bool": ({"bool"}, 'flexnpu_opapi_bool(e, "{p}", {p});'),
    "double": ({"double", "float"}, 'flexnpu_opapi_double(e, "{p}", {p});'),
    "intarray": ({"const aclIntArray *"}, 'flexnpu_opapi_int_array(e, "{p}", {p}, 0);'),
    "intarray?": ({"const aclIntArray *"}, 'flexnpu_opapi_int_array(e, "{p}", {p}, 1);'),
    "string": ({"char *", "const char *"}, 'flexnpu_opapi_string(e, "{p}", {p});'),
}
NAME = re.compile(r"^aclnn[A-Z]\w{1,58}$")
PARAM = re.compile(r"^[a-zA-Z_]\w{0,40}$")
HEADER = re.compile(r"^aclnn_[a-z0-9_]+\.h$")


class TableError(ValueError):
    """A row of the table is malformed; the message names the row and the field."""


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    kind: str
    ctype: str

    def decl(self) -> str:
        return f"{self.ctype}{'' if self.ctype.endswith('*') else ' '}{self.name}"


@dataclass(frozen=True, slots=True)
class Function:
    name: str
    header: str
    params: tuple[Param, ...]

    def workspace_proto(self) -> str:
        params = [p.decl() for p in self.params] + ["uint64_t *workspaceSize", "aclOpExecutor **executor"]
        return f"aclnnStatus {self.name}GetWorkspaceSize({', '.join(params)})"

    def launch_proto(self) -> str:
        return (
            f"aclnnStatus {self.name}(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, "
            "aclrtStream stream)"
        )


def load(path: Path = TABLE) -> list[Function]:
    """The table's functions, each row checked (a bad one is refused naming the row and the field)."""
    doc = json.loads(path.read_text())
    if doc.get("format") != 1 or not isinstance(doc.get("functions"), list):
        raise TableError(f"{path.name}: format must be 1 and functions a list")
    out: list[Function] = []
    seen: set[str] = set()
    for i, row in enumerate(doc["functions"]):
        where = f"{path.name} row {i} ({row.get('name', '?')!r})"
        if set(row) != {"name", "header", "params"}:
            raise TableError(f"{where}: fields must be name, header, params, not {sorted(row)}")
        if not isinstance(row["name"], str) or not NAME.match(row["name"]) or row["name"] in seen:
            raise TableError(f"{where}: name must be a new aclnn function name")
        if not isinstance(row["header"], str) or not HEADER.match(row["header"]):
            raise TableError(f"{where}: header must be aclnn_<name>.h")
        params = []
        for j, p in enumerate(row["params"]):
            if set(p) != {"name", "kind", "ctype"} or not PARAM.match(str(p["name"])):
                raise TableError(f"{where}: params[{j}] must have a C name, a kind and a ctype")
            if p["kind"] not in KINDS:
                raise TableError(f"{where}: params[{j}].kind {p['kind']!r} is not one of {sorted(KINDS)}")
            if p["ctype"] not in KINDS[p["kind"]][0]:
                raise TableError(f"{where}: params[{j}].ctype {p['ctype']!r} does not fit kind {p['kind']!r}")
            params.append(Param(p["name"], p["kind"], p["ctype"]))
        if [p.name for p in params].count("workspaceSize") or len({p.name for p in params}) != len(params):
            raise TableError(f"{where}: params must have distinct names")
        seen.add(row["name"])
        out.append(Function(row["name"], row["header"], tuple(params)))
    return out


def header(name: str, functions: list[Function]) -> str:
    guard = "FLEXNPU_ACLNNOP_" + name.upper().replace(".", "_") + "_"
    lines = [
        f"/* aclnnop/{name}: generated by libascendcl/api/generate_aclnn.py from api/aclnn_api.json; do not edit.",
        " * CANN's prototypes; served by the share's libopapi.so (the aclserver computes the operators). */",
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        '#include "../aclnn/acl_meta.h"',
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
    ]
    for f in functions:
        lines += [
            f"ACL_FUNC_VISIBILITY {f.workspace_proto()};",
            f"ACL_FUNC_VISIBILITY {f.launch_proto()};",
            "",
        ]
    lines += ["#ifdef __cplusplus", "}", "#endif", "", f"#endif /* {guard} */", ""]
    return "\n".join(lines)


def functions_c(functions: list[Function]) -> str:
    lines = [
        "/* aclnn_functions.c: generated by libascendcl/api/generate_aclnn.py from api/aclnn_api.json; do not edit.",
        " * Each aclnnXxxGetWorkspaceSize builds an executor from its parameters (opapi.h); each aclnnXxx",
        " * sends it as one operator. */",
        '#include "opapi.h"',
        "",
    ]
    headers = sorted({f.header for f in functions})
    lines += [f'#include "aclnnop/{h}"' for h in headers] + [""]
    for f in functions:
        lines += [
            f"API {f.workspace_proto()}",
            "{",
            f'    aclOpExecutor *e = flexnpu_opapi_begin("{f.name}");',
        ]
        lines += ["    " + KINDS[p.kind][1].format(p=p.name) for p in f.params]
        lines += ["    return flexnpu_opapi_finish(e, workspaceSize, executor);", "}", ""]
        lines += [f"API {f.launch_proto()}", "{"]
        lines += [
            f'    return flexnpu_opapi_launch("{f.name}", workspace, workspaceSize, executor, stream);',
            "}",
            "",
        ]
    return "\n".join(lines)


def rendered(functions: list[Function]) -> dict[Path, str]:
    """Every generated file and its content."""
    by_header: dict[str, list[Function]] = {}
    for f in functions:
        by_header.setdefault(f.header, []).append(f)
    out = {HEADERS / name: header(name, fs) for name, fs in sorted(by_header.items())}
    out[CLOSURE / "aclnn_functions.c"] = functions_c(functions)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated file is stale")
    args = parser.parse_args(argv)
    try:
        files = rendered(load())
    except TableError as exc:
        print(f"generate_aclnn: {exc}", file=sys.stderr)
        return 1
    stale = [p for p, text in files.items() if not p.exists() or p.read_text() != text]
    extra = sorted(set(HEADERS.glob("aclnn_*.h")) - set(files))
    if args.check:
        for p in [*stale, *extra]:
            print(f"generate_aclnn: {p.relative_to(ROOT)} is stale (run libascendcl/api/generate_aclnn.py)",
                  file=sys.stderr)  # fmt: skip
        return 1 if stale or extra else 0
    HEADERS.mkdir(parents=True, exist_ok=True)
    for p in stale:
        p.write_text(files[p])
    for p in extra:
        p.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
