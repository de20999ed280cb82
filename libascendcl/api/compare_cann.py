"""``python3 libascendcl/api/compare_cann.py CANN_INCLUDE``: our ACL surface against CANN's own headers.

For maintainers with a CANN installation or CANN's header sources (a directory holding
``acl/acl.h``, e.g. ``/usr/local/Ascend/ascend-toolkit/latest/include``). It checks, with the system
C++ compiler:

- names: every function CANN's headers declare that the table lacks (a new CANN release);
- prototypes: each table row, redeclared ``extern "C"`` after CANN's headers, must not conflict
  (C++ refuses two C functions of one name with different types);
- values: every numeric name of ``tests/c/cann_values.json`` has the same value in CANN's headers
  and in ours;
- layouts: every struct, union and enum type both declare has the same size and alignment.

Exits 1 and prints each difference; nothing here runs in CI (CI has no CANN headers).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import generate

__all__ = ["main"]

VALUES = generate.ROOT.parent / "tests" / "c" / "cann_values.json"
_HEADERS = ("acl/acl.h", "acl/acl_op_compiler.h", "acl/acl_prof.h", "acl/acl_tdt.h", "acl/acl_tdt_queue.h",
            "acl/ops/acl_dvpp.h", "acl/ops/acl_cblas.h")  # fmt: skip
_DECLARED = re.compile(r"(?:ACL_FUNC_VISIBILITY|ACL_DUMP_API|MSVP_PROF_API)\s+[^;{(]*?\b(acl\w+)\s*\(")


def _includes(root: Path) -> str:
    return "".join(f'#include "{h}"\n' for h in _HEADERS if (root / h).is_file())


def _build_and_run(source: str, include: Path, work: Path, name: str) -> tuple[int, str]:
    src, exe = work / f"{name}.cc", work / name
    src.write_text(source)
    res = subprocess.run(
        ["c++", "-std=c++17", "-w", "-DENABLE_DVPP_INTERFACE", f"-I{include}", str(src), "-o", str(exe)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if res.returncode:
        return res.returncode, res.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=False)
    return out.returncode, out.stdout


def missing_names(cann: Path, rows: Sequence[generate.Row]) -> list[str]:
    """Functions that CANN's copies of the headers we ship declare and the table does not list."""
    known = {r.name for r in rows}
    declared: set[str] = set()
    for ours in generate.INCLUDE.rglob("*.h"):
        header = cann / "acl" / ours.relative_to(generate.INCLUDE)
        if header.is_file():
            text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", header.read_text(errors="replace"), flags=re.S)
            declared |= set(_DECLARED.findall(text))
    return sorted(declared - known)


def prototype_conflicts(cann: Path, rows: Sequence[generate.Row], work: Path) -> str:
    """The compiler's complaints about our prototypes redeclared after CANN's headers ('' when none)."""
    decls = "".join(f"{r.proto};\n" for r in rows if r.header)
    src = work / "protos.cc"
    src.write_text(f'{_includes(cann)}extern "C" {{\n{decls}}}\n')
    res = subprocess.run(
        ["c++", "-std=c++17", "-w", "-DENABLE_DVPP_INTERFACE", f"-I{cann}", "-fsyntax-only", str(src)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return "\n".join(line for line in res.stderr.splitlines() if "error" in line)


def _printed(source_lines: str, include: Path, work: Path, name: str) -> dict[str, str]:
    code, out = _build_and_run(
        f"{_includes(include)}#include <cstdio>\nint main()\n{{\n{source_lines}    return 0;\n}}\n",
        include,
        work,
        name,
    )
    if code:
        raise RuntimeError(f"{name} against {include}:\n{out[:4000]}")
    return dict(line.split(" ", 1) for line in out.splitlines())


def value_differences(cann: Path, names: Sequence[str], work: Path) -> dict[str, tuple[str, str]]:
    lines = "".join(f'    std::printf("{n} %llu\\n", (unsigned long long)({n}));\n' for n in names)
    theirs = _printed(lines, cann, work, "values_cann")
    ours = _printed(lines, generate.INCLUDE.parent, work, "values_ours")
    return {n: (theirs[n], ours[n]) for n in names if theirs[n] != ours[n]}


def _types(include: Path) -> set[str]:
    found: set[str] = set()
    for header in (include / "acl").rglob("*.h"):
        found |= set(re.findall(r"\}\s*(\w+)\s*;", header.read_text(errors="replace")))
    return found


def layout_differences(cann: Path, work: Path) -> dict[str, tuple[str, str]]:
    common = sorted(_types(cann) & _types(generate.INCLUDE.parent))
    lines = "".join(f'    std::printf("{t} %zu %zu\\n", sizeof({t}), alignof({t}));\n' for t in common)
    try:
        theirs = _printed(lines, cann, work, "layout_cann")
    except RuntimeError as exc:  # a struct member name matched the pattern: drop what does not compile
        bad = set(re.findall(r"[\u2018'](\w+)[\u2019'] was not declared", str(exc)))
        common = [t for t in common if t not in bad]
        lines = "".join(f'    std::printf("{t} %zu %zu\\n", sizeof({t}), alignof({t}));\n' for t in common)
        theirs = _printed(lines, cann, work, "layout_cann")
    ours = _printed(lines, generate.INCLUDE.parent, work, "layout_ours")
    return {t: (theirs[t], ours[t]) for t in common if theirs[t] != ours[t]}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("cann_include", type=Path, help="a directory holding CANN's acl/acl.h")
    args = parser.parse_args(argv)
    cann: Path = args.cann_include
    if not (cann / "acl" / "acl.h").is_file():
        print(f"compare_cann: {cann}/acl/acl.h does not exist", file=sys.stderr)
        return 2
    rows = generate.load()
    names = list(json.loads(VALUES.read_text())["values"])
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="compare-cann-") as tmp:
        work = Path(tmp)
        problems += [f"not in the table: {n}" for n in missing_names(cann, rows)]
        conflicts = prototype_conflicts(cann, rows, work)
        problems += [f"prototype: {line}" for line in conflicts.splitlines()]
        problems += [
            f"value {n}: CANN {a}, ours {b}" for n, (a, b) in value_differences(cann, names, work).items()
        ]
        problems += [
            f"layout {t}: CANN {a}, ours {b}" for t, (a, b) in layout_differences(cann, work).items()
        ]
    for line in problems:
        print(line)
    print(
        f"compare_cann: {len(rows)} functions, {len(names)} values, the layouts of the common types",
        file=sys.stderr,
    )
    print(f"compare_cann: {len(problems)} difference(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
