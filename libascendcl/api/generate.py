"""``python3 libascendcl/api/generate.py [--check]``: libascendcl's C surface from its one table.

``acl_api.json`` (beside this file) lists every function of CANN's ACL headers that the library
declares, one row each (the fields are documented in libascendcl/README.md, "The API table").
From it this script writes:

- the function declarations of every header in ``include/acl/`` (between the ``@generated``
  markers; the types, enums and macros around them are written by hand),
- ``src/stubs.c``: every row served as ``stub`` (200001 and a message naming the function),
- ``src/prototypes.h``: ``(void)`` prototypes of the functions CANN declares with ``()``,
- ``src/exports.map``: the linker version script that exports exactly the table's functions,
- ``API.md``: what is remoted, what is host-side, what is a stub, what is left to another library;
- from ``closure.json``, the share's other client libraries (CANN's SONAMEs that frameworks load
  beside libascendcl.so, libascendcl/README.md "The closure"): ``closure/forward_<name>.c`` for a
  library whose functions forward to libascendcl.so's, ``closure/closure.mk`` (each library's
  sources, for the Makefile) and the ``ld.so.preload`` list of them all.

``--check`` writes nothing and exits 1 when a generated file differs from what the table says, or
when a ``remote``/``host`` row names a file that does not define its function. Standard library
only, so it runs before the project is installed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Row",
    "api_md",
    "calls_c",
    "declarations",
    "exports_map",
    "load",
    "main",
    "prototypes_h",
    "rendered",
    "stubs_c",
    "undefined",
]

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "api" / "acl_api.json"
INCLUDE = ROOT / "include" / "acl"
SRC = ROOT / "src"
BEGIN = "/* @generated functions begin (libascendcl/api/generate.py) */"
END = "/* @generated functions end */"
SERVES = ("remote", "host", "stub", "library")
RETURNS = ("error", "pointer", "void", "value")
_FIELDS = {"name", "header", "family", "serve", "file", "library", "returns", "fail", "deprecated", "weak", "note",
           "proto"}  # fmt: skip
_WIDTH = 110
CLOSURE = ROOT / "api" / "closure.json"
CLOSURE_DIR = ROOT / "closure"
FLEXNPU_EXPORTS = ("fx_op_launch",)
"""FlexNPU's own entry points, exported beside the table's for the share's other client libraries
(``include/acl/flexnpu_op.h``); not CANN functions."""


@dataclass(frozen=True, slots=True)
class Row:
    """One function of the table."""

    name: str
    header: str | None  # under include/acl/; None: declared by no CANN header (kept for compatibility)
    family: str
    serve: str  # remote | host | stub | library
    returns: str  # error | pointer | void | value
    proto: str  # CANN's prototype: return type, name, parameters (no visibility macro, no ';')
    file: str | None = None  # remote/host: the file of src/ that defines it
    library: str | None = (
        None  # the CANN library that has it (library rows; stub rows kept for compatibility)
    )
    fail: str | None = None  # stub rows returning a value: CANN's failure value
    deprecated: str | None = None  # CANN's deprecation message
    weak: bool = False  # declared weak (ACL_DUMP_WEAK), as CANN does
    note: str | None = None  # how it is served, when that differs from the name's promise

    @property
    def exported(self) -> bool:
        return self.serve != "library"

    @property
    def return_type(self) -> str:
        return self.proto[: self.proto.index(self.name + "(")].strip()

    @property
    def params(self) -> str:
        return self.proto[self.proto.index(self.name + "(") + len(self.name) + 1 : -1]


class TableError(ValueError):
    """The table is malformed; the message names the row and the field."""


def load(path: Path = TABLE) -> list[Row]:
    """The table's rows, validated (``TableError`` names the first bad row and field)."""
    doc = json.loads(path.read_text())
    if doc.get("format") != 1 or not isinstance(doc.get("functions"), list):
        raise TableError(f"{path}: expected format 1 with a functions list")
    rows: list[Row] = []
    seen: set[str] = set()
    for i, raw in enumerate(doc["functions"]):
        where = f"{path.name} row {i} ({raw.get('name', '?')})"
        unknown = set(raw) - _FIELDS
        if unknown:
            raise TableError(f"{where}: unknown field(s) {sorted(unknown)}")
        for key in ("name", "family", "serve", "returns", "proto"):
            if not isinstance(raw.get(key), str) or not raw[key]:
                raise TableError(f"{where}: field {key} must be a non-empty string")
        row = Row(**raw)
        _validate(row, where)
        if row.name in seen:
            raise TableError(f"{where}: field name repeats {row.name}")
        seen.add(row.name)
        rows.append(row)
    return rows


def _validate(row: Row, where: str) -> None:
    if not re.fullmatch(r"acl\w+", row.name):
        raise TableError(f"{where}: field name must be an ACL identifier")
    if row.serve not in SERVES:
        raise TableError(f"{where}: field serve must be one of {SERVES}")
    if row.returns not in RETURNS:
        raise TableError(f"{where}: field returns must be one of {RETURNS}")
    if not re.fullmatch(rf"[\w\s\*]+\b{row.name}\(.*\)", row.proto):
        raise TableError(f"{where}: field proto must read '<type> {row.name}(<parameters>)'")
    if row.header is not None and not (INCLUDE / row.header).is_file():
        raise TableError(f"{where}: field header names no file under include/acl")
    if (row.serve in ("remote", "host")) != (row.file is not None):
        raise TableError(f"{where}: field file is required for remote/host rows and only for them")
    if row.file is not None and not re.fullmatch(r"[a-z0-9_]+\.c", row.file):
        raise TableError(f"{where}: field file must name a .c file of src/")
    if row.serve == "library" and not row.library:
        raise TableError(f"{where}: field library is required for library rows")
    ret = row.return_type
    expected = (
        "error"
        if ret == "aclError"
        else "void"
        if ret == "void"
        else "pointer"
        if ret.endswith("*")
        else None
    )
    if expected is not None and row.returns != expected:
        raise TableError(f"{where}: field returns must be {expected} for a function returning {ret}")
    if expected is None and row.returns not in ("pointer", "value"):
        raise TableError(f"{where}: field returns must be pointer or value for a function returning {ret}")
    if (row.serve == "stub" and row.returns == "value") != (row.fail is not None):
        raise TableError(f"{where}: field fail is required for stubs returning a value, and only for them")


# -- declarations -------------------------------------------------------------------------------


def _wrap(text: str, indent: str = "    ") -> str:
    """``text`` (one declaration) broken at parameter boundaries to fit the line width."""
    if len(text) <= _WIDTH:
        return text
    head, _, rest = text.partition("(")
    parts = _split_params(rest[:-2]) if rest.endswith(");") else [rest]
    lines, line = [], head + "("
    for k, part in enumerate(parts):
        piece = part + (", " if k + 1 < len(parts) else ");")
        if len(line) + len(piece.rstrip()) > _WIDTH and line.strip():
            lines.append(line.rstrip())
            line = indent
        line += piece
    lines.append(line.rstrip())
    return "\n".join(lines)


def _split_params(params: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in params:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _declaration(row: Row) -> str:
    prefix = f'ACL_DEPRECATED_MESSAGE("{row.deprecated}")\n' if row.deprecated else ""
    weak = "ACL_DUMP_WEAK " if row.weak else ""
    return prefix + _wrap(f"{weak}ACL_FUNC_VISIBILITY {row.proto};")


def declarations(rows: Sequence[Row], header: str) -> str:
    """The generated block of ``include/acl/<header>``: its functions grouped by family."""
    families: dict[str, list[Row]] = {}
    for row in rows:
        if row.header == header:
            families.setdefault(row.family, []).append(row)
    out = [
        f"/* {family} */\n" + "\n".join(_declaration(r) for r in members)
        for family, members in families.items()
    ]
    return "\n\n".join(out)


def _splice(text: str, block: str, where: Path) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise TableError(f"{where}: the @generated markers are missing")
    inner = f"\n{block}\n" if block else "\n"
    return text[: start + len(BEGIN)] + inner + text[end:]


# -- stubs ----------------------------------------------------------------------------------------


def _param_names(params: str) -> list[str]:
    names = []
    for p in _split_params(params):
        if p in ("void", "..."):
            continue
        fn = re.search(r"\(\s*\*\s*(?:const\s+)?(\w+)\s*\)", p)
        if fn:
            names.append(fn.group(1))
            continue
        m = re.search(r"(\w+)\s*(?:\[[^\]]*\]\s*)*$", p)
        if m is None:
            raise TableError(f"cannot name the parameter {p!r}")
        names.append(m.group(1))
    return names


def _stub_answer(row: Row) -> str | None:
    """What a stub returns, by the kind of its return type (None: it returns nothing)."""
    answers = {"error": "ACL_ERROR_API_NOT_SUPPORT", "pointer": "NULL", "value": row.fail, "void": None}
    return answers[row.returns]


def _definition(row: Row) -> str:
    params = row.params.strip() or "void"
    head = _wrap(f"API {row.return_type} {row.name}({params})" + ";")[:-1]
    body = [f"    (void){n};" for n in _param_names(row.params)]
    answer = _stub_answer(row)
    if answer is None:
        body.append(f'    flexnpu_unsupported_note("{row.name}");')
    else:
        body.append(f'    (void)flexnpu_unsupported("{row.name}");')
        body.append(f"    return {answer};")
    proto = "" if row.header else _wrap(f"API {row.return_type} {row.name}({params});") + "\n"
    return proto + head + "\n{\n" + "\n".join(body) + "\n}\n"


def stubs_c(rows: Sequence[Row]) -> str:
    """``src/stubs.c``: the definition of every stub row."""
    stubs = [r for r in rows if r.serve == "stub"]
    headers = sorted({r.header for r in stubs if r.header} | {"acl.h"})
    includes = "\n".join(f'#include "acl/{h}"' for h in headers)
    body = "\n".join(_definition(r) for r in stubs)
    return (
        "/*\n * stubs.c: the ACL functions a FlexNPU share does not serve. Generated by\n"
        " * libascendcl/api/generate.py from api/acl_api.json; do not edit. Each answers\n"
        " * ACL_ERROR_API_NOT_SUPPORT (200001) with a message naming it (aclGetRecentErrMsg);\n"
        " * pointer-returning ones return NULL, value-returning ones CANN's failure value, void\n"
        " * ones only leave the message.\n */\n"
        f'#include "client.h"\n\n{includes}\n\n#include <stddef.h>\n\n{body}'
    )


def prototypes_h(rows: Sequence[Row]) -> str:
    """``src/prototypes.h``: ``(void)`` prototypes of the exported functions CANN declares with ``()``.

    In C an empty parameter list is no prototype; the library's own build (-Wmissing-prototypes,
    -Wstrict-prototypes) needs one before each definition, and a compatible redeclaration is one."""
    lines = [
        f"{r.return_type} {r.name}(void);" for r in rows if r.exported and r.header and not r.params.strip()
    ]
    return (
        "/* Generated by libascendcl/api/generate.py from api/acl_api.json; do not edit.\n"
        "   (void) prototypes of the functions CANN's headers declare with (), for the library's own build. */\n"
        "#ifndef FLEXNPU_PROTOTYPES_H_\n#define FLEXNPU_PROTOTYPES_H_\n\n"
        '#include "acl/acl.h"\n\n' + "\n".join(lines) + "\n\n#endif /* FLEXNPU_PROTOTYPES_H_ */\n"
    )


def exports_map(rows: Sequence[Row]) -> str:
    """``src/exports.map``: the version script exporting exactly the table's exported functions."""
    exported = sorted([r.name for r in rows if r.exported] + list(FLEXNPU_EXPORTS))
    names = "\n".join(f"    {name};" for name in exported)
    return (
        "/* Generated by libascendcl/api/generate.py from api/acl_api.json; do not edit.\n"
        "   libascendcl.so exports exactly these functions. */\n"
        f"{{\n  global:\n{names}\n  local:\n    *;\n}};\n"
    )


# -- a program that calls them ----------------------------------------------------------------------


def _zero(param: str) -> str:
    """A zero argument for one parameter of a prototype."""
    if re.search(r"\(\s*\*", param) or "[" in param or "*" in param:
        return "NULL"
    name = _param_names(param)[0]
    return f"({param[: param.rindex(name)].strip()}){{0}}"


def calls_c(rows: Sequence[Row]) -> str:
    """A C program that takes the address of every exported function (so it links only if all
    resolve) and calls every stub once with zero arguments, printing ``<name> ok`` or
    ``<name> FAIL <why>``: a stub must answer its kind's failure and name itself in
    aclGetRecentErrMsg. Exits with the number of failures."""
    exported = [r for r in rows if r.exported]
    headers = sorted({r.header for r in exported if r.header} | {"acl.h"})
    out = ["/* Generated by libascendcl/api/generate.py (calls_c) from api/acl_api.json. */"]
    out += [f'#include "acl/{h}"' for h in headers]
    out += [
        "#include <stdio.h>",
        "#include <string.h>",
        '#pragma GCC diagnostic ignored "-Wdeprecated-declarations"',
    ]
    out += [f"{r.proto};" for r in exported if r.header is None]
    out += ["typedef void (*any_fn)(void);", "static const any_fn every[] = {"]
    out += [f"    (any_fn){r.name}," for r in exported]
    out += ["};", "static int failures;", "static void verdict(const char *name, int ok, const char *why)", "{",
            '    const char *m = aclGetRecentErrMsg();',
            '    char want[256];',
            '    snprintf(want, sizeof want, "%s is not supported", name);',
            '    if (ok && (!m || !strstr(m, want))) { ok = 0; why = "message does not name it"; }',
            '    printf("%s %s %s\\n", name, ok ? "ok" : "FAIL", ok ? "" : why);',
            "    failures += !ok;", "}", "int main(void)", "{",
            '    printf("exported %zu\\n", sizeof every / sizeof every[0]);']  # fmt: skip
    for r in exported:
        if r.serve != "stub":
            continue
        args = ", ".join(_zero(p) for p in _split_params(r.params) if p not in ("void", "..."))
        call, answer = f"{r.name}({args})", _stub_answer(r)
        if answer is None:
            out.append(f'    {call};\n    verdict("{r.name}", 1, "");')
        else:
            out.append(f'    verdict("{r.name}", {call} == {answer}, "not {answer}");')
    out += ["    return failures;", "}"]
    return "\n".join(out) + "\n"


# -- the surface, for readers --------------------------------------------------------------------

_SECTIONS = {
    "remote": "Remoted: served by the claim's aclserver over the control link",
    "host": "Host-side: served in the client, with no server round trip and no quota",
    "stub": "Stubs: exported, answer ACL_ERROR_API_NOT_SUPPORT (200001) with a message naming the function",
    "library": "Declared, not exported: CANN has them in another library",
}


def api_md(rows: Sequence[Row]) -> str:
    """``API.md``: every function by how it is served, then by family."""
    exported = sum(r.exported for r in rows)
    out = [
        "# libascendcl: the ACL surface, function by function",
        "",
        "Generated by `python3 libascendcl/api/generate.py` from `libascendcl/api/acl_api.json`; do not edit.",
        f"{len(rows)} functions are declared in `include/acl/`; libascendcl.so exports {exported}.",
        "",
        "| served | functions |",
        "|---|---|",
    ]
    out += [f"| {serve} | {sum(r.serve == serve for r in rows)} |" for serve in SERVES]
    for serve in SERVES:
        chosen = [r for r in rows if r.serve == serve]
        out += ["", f"## {_SECTIONS[serve]}", ""]
        families: dict[str, list[Row]] = {}
        for r in chosen:
            families.setdefault(r.family, []).append(r)
        for family, members in families.items():
            names = ", ".join(_md_name(r, serve) for r in members)
            out.append(f"- **{family}** ({len(members)}): {names}")
        notes = [r for r in chosen if r.note]
        if notes:
            out += ["", "Notes:", ""]
            out += [f"- `{r.name}`: {r.note}" for r in notes]
    return "\n".join(out) + "\n"


def _md_name(row: Row, serve: str) -> str:
    if serve in ("remote", "host"):
        return f"`{row.name}` ({row.file})"
    if serve == "library":
        return f"`{row.name}` ({row.library})"
    return f"`{row.name}`" + (f" ({row.library})" if row.library else "")


# -- files ----------------------------------------------------------------------------------------


def rendered(rows: Sequence[Row]) -> dict[Path, str]:
    """Every generated file's path and the text the table gives it."""
    out = {
        SRC / "stubs.c": stubs_c(rows),
        SRC / "prototypes.h": prototypes_h(rows),
        SRC / "exports.map": exports_map(rows),
        ROOT / "API.md": api_md(rows),
        **closure_files(rows),
    }
    for header in sorted(INCLUDE.rglob("*.h")):
        text = header.read_text()
        if BEGIN in text:
            name = header.relative_to(INCLUDE).as_posix()
            out[header] = _splice(text, declarations(rows, name), header)
    declared = {r.header for r in rows if r.header}
    missing = sorted(h for h in declared if (INCLUDE / h) not in out)
    if missing:
        raise TableError(f"headers without @generated markers: {missing}")
    return out


# -- the closure: the share's other client libraries ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Library:
    """One library of the closure: its SONAME, hand-written sources under ``closure/``, and the
    table's functions it forwards to libascendcl.so (resolved there with ``dlsym`` at first call)."""

    soname: str
    about: str
    sources: tuple[str, ...] = ()
    forward: tuple[str, ...] = ()

    @property
    def stem(self) -> str:
        return self.soname.removeprefix("lib").removesuffix(".so")


def load_closure(rows: Sequence[Row], path: Path = CLOSURE) -> list[Library]:
    """The closure's libraries, validated against the table (``TableError`` names the field)."""
    doc = json.loads(path.read_text())
    if doc.get("format") != 1 or not isinstance(doc.get("libraries"), list):
        raise TableError(f"{path}: expected format 1 with a libraries list")
    by_name = {r.name: r for r in rows}
    libs: list[Library] = []
    for i, raw in enumerate(doc["libraries"]):
        where = f"{path.name} libraries[{i}]"
        unknown = set(raw) - {"soname", "about", "sources", "forward"}
        if unknown:
            raise TableError(f"{where}: unknown field(s) {sorted(unknown)}")
        lib = Library(raw.get("soname", ""), raw.get("about", ""), tuple(raw.get("sources", ())),
                      tuple(raw.get("forward", ())))  # fmt: skip
        if not re.fullmatch(r"lib[a-z0-9_]+\.so", lib.soname) or lib.soname == "libascendcl.so":
            raise TableError(f"{where}: field soname must be lib<name>.so, not libascendcl.so")
        if not lib.about:
            raise TableError(f"{where}: field about must say what the library is")
        for src in lib.sources:
            if not re.fullmatch(r"[a-z0-9_]+\.c", src) or not (CLOSURE_DIR / src).is_file():
                raise TableError(f"{where}: field sources names no file closure/{src}")
        for name in lib.forward:
            row = by_name.get(name)
            if row is None or not row.exported:
                raise TableError(f"{where}: field forward names {name}, which libascendcl.so does not export")
        libs.append(lib)
    return libs


def _forward_definition(row: Row) -> str:
    params = row.params.strip() or "void"
    names = ", ".join(_param_names(row.params))
    head = _wrap(f"API {row.return_type} {row.name}({params})" + ";")[:-1]
    fail = {"error": "ACL_ERROR_API_NOT_SUPPORT", "pointer": "NULL", "value": row.fail or "0"}.get(
        row.returns
    )
    call = f"fn({names})"
    body = [
        f"    static __typeof__({row.name}) *fn;",
        f'    if (!fn && !(fn = (__typeof__(fn))closure_lookup("{row.name}")))',
        "        return;" if fail is None else f"        return {fail};",
        f"    {call};" if fail is None else f"    return {call};",
    ]
    return head + "\n{\n" + "\n".join(body) + "\n}\n"


def forward_c(lib: Library, rows: Sequence[Row]) -> str:
    """``closure/forward_<stem>.c``: lib's functions, each calling libascendcl.so's."""
    by_name = {r.name: r for r in rows}
    fns = [by_name[n] for n in lib.forward]
    headers = sorted({r.header for r in fns if r.header} | {"acl.h"})
    includes = "\n".join(f'#include "acl/{h}"' for h in headers)
    return (
        f"/* Generated by libascendcl/api/generate.py from api/closure.json; do not edit.\n"
        f"   {lib.soname}: {lib.about}\n"
        f"   Each function calls libascendcl.so's (found with dlsym on its handle, so never this one). */\n"
        f'{includes}\n#include "closure.h"\n\n' + "\n".join(_forward_definition(r) for r in fns)
    )


def closure_mk(libs: Sequence[Library]) -> str:
    """``closure/closure.mk``: each library's sources, for the Makefile."""
    lines = [
        "# Generated by libascendcl/api/generate.py from api/closure.json; do not edit.",
        "CLOSURE_LIBS := " + " ".join(lib.soname for lib in libs),
    ]
    for lib in libs:
        srcs = [f"closure/{s}" for s in lib.sources] + (
            [f"closure/forward_{lib.stem}.c"] if lib.forward else []
        )
        lines.append(f"CLOSURE_SRCS_{lib.stem} := " + " ".join(srcs))
    return "\n".join(lines) + "\n"


def closure_files(rows: Sequence[Row]) -> dict[Path, str]:
    libs = load_closure(rows)
    out = {CLOSURE_DIR / "closure.mk": closure_mk(libs)}
    for lib in libs:
        if lib.forward:
            out[CLOSURE_DIR / f"forward_{lib.stem}.c"] = forward_c(lib, rows)
    return out


def undefined(rows: Sequence[Row]) -> list[str]:
    """remote/host rows whose named file does not define the function (``name`` in missing files too)."""
    bad = []
    for row in rows:
        if row.file is None:
            continue
        path = SRC / row.file
        text = path.read_text() if path.is_file() else ""
        if not re.search(rf"^API\b[^;{{]*\b{row.name}\(", text, flags=re.M):
            bad.append(f"{row.name}: not defined in src/{row.file}")
    return bad


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated file is stale")
    args = parser.parse_args(argv)
    try:
        rows = load()
        files = rendered(rows)
    except (TableError, OSError, json.JSONDecodeError) as exc:
        print(f"generate: {exc}", file=sys.stderr)
        return 2
    problems = undefined(rows)
    stale = [p for p, text in files.items() if not p.is_file() or p.read_text() != text]
    if args.check:
        for p in stale:
            problems.append(f"{p.relative_to(ROOT)} is stale: run python3 libascendcl/api/generate.py")
    else:
        for p in stale:
            p.write_text(files[p])
            print(f"wrote {p.relative_to(ROOT)}")
    for line in problems:
        print(f"generate: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
