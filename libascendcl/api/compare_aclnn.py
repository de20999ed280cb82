"""``python3 libascendcl/api/compare_aclnn.py <CANN's aclnnop include directory>``: the aclnn table against CANN.

For maintainers with CANN's headers (``.../opp/built-in/op_impl/ai_core/tbe/op_api/include/aclnnop``): every
row of ``aclnn_api.json`` is looked up by its ``aclnnXxxGetWorkspaceSize`` declaration in any header there,
and its parameters compared — names, C types and order (the trailing ``workspaceSize``/``executor`` of
CANN's two-phase convention by type). Prints one line per difference and exits 1 when there is one
(or a function no header declares). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

TABLE = Path(__file__).resolve().parent / "aclnn_api.json"
_DECL = re.compile(r"aclnnStatus\s+(aclnn\w+)GetWorkspaceSize\s*\((.*?)\)\s*;", re.S)
_TAIL = [("uint64_t *", "workspaceSize"), ("aclOpExecutor **", "executor")]


def _param(text: str) -> tuple[str, str]:
    """``const aclTensor* self`` -> (``const aclTensor *``, ``self``)."""
    spaced = " ".join(text.replace("*", " * ").split())
    ctype, _, name = spaced.rpartition(" ")
    return ctype.replace(" *", " *").replace("* *", "**"), name


def declarations(include: Path) -> dict[str, list[tuple[str, str]]]:
    """Every GetWorkspaceSize declared under ``include``: function -> [(C type, name)]."""
    out: dict[str, list[tuple[str, str]]] = {}
    for header in sorted(include.glob("*.h")):
        text = re.sub(
            r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", header.read_text(errors="replace"), flags=re.S)
        )
        for m in _DECL.finditer(text):
            out.setdefault(m.group(1), [_param(p) for p in m.group(2).split(",")])
    return out


def differences(include: Path, table: Path = TABLE) -> list[str]:
    found = declarations(include)
    out = []
    for row in json.loads(table.read_text())["functions"]:
        name = row["name"]
        cann = found.get(name)
        if cann is None:
            out.append(f"{name}: no header in {include} declares {name}GetWorkspaceSize")
            continue
        cann = [(" ".join(t.split()).replace("* *", "**"), n) for t, n in cann]
        # the two-phase tail by type only: some CANN headers name it workspace_size or opExecutor
        cann = cann[: -len(_TAIL)] + [
            (t, n) for (t, _), (_, n) in zip(cann[-len(_TAIL) :], _TAIL, strict=True)
        ]
        ours = [(p["ctype"], p["name"]) for p in row["params"]] + _TAIL
        if ours != cann:
            out.append(f"{name}: ours {ours} != CANN's {cann}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("include", type=Path, help="CANN's aclnnop include directory")
    args = parser.parse_args(argv)
    diffs = differences(args.include)
    for line in diffs:
        print(line)
    print(f"{len(diffs)} differences", file=sys.stderr)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
