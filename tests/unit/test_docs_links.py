"""The documentation's links hold: every relative link and ``#anchor`` in the repository's Markdown files
(README.md, CHANGELOG.md, docs/, the example and package READMEs) names a file or directory that exists and a
heading that file has, by GitHub's heading-anchor rules; and the top-level README stays short.

Links are ``[text](target)``, ``![alt](target)`` and ``[label]: target`` outside code blocks and code spans;
URLs with a scheme (``https:``, ``mailto:``) are not followed. An anchor is a heading's GitHub slug (the heading's
rendered text, lower-cased, with punctuation other than ``-`` and ``_`` removed and each space a ``-``; a repeated
slug gets ``-1``, ``-2``, …) or an explicit ``<a id=…>``/``<a name=…>``.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_BYTES = 15 * 1024
SKIP_DIRS = {".git", ".venv", "build", "dist", "node_modules", "__pycache__", ".pytest_cache", ".mypy_cache"}

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?:.+?)\1", re.S)
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.M)
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:[^>]*\s)?(?:id|name)=[\"']([^\"']+)[\"']", re.I)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def markdown_files(root: Path = ROOT) -> list[Path]:
    """Every ``.md`` file of the repository, outside VCS, virtualenv and build directories."""
    out = []
    for path in sorted(root.rglob("*.md")):
        rel = path.relative_to(root).parts
        dirs = [root.joinpath(*rel[: i + 1]) for i in range(len(rel) - 1)]
        if any(p in SKIP_DIRS or p.endswith(".egg-info") for p in rel[:-1]):
            continue
        if any((d / "pyvenv.cfg").exists() for d in dirs):  # a virtualenv under another name
            continue
        out.append(path)
    return out


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (fenced lines become empty, so numbering holds)."""
    out, fence = [], ""
    for line in text.split("\n"):
        m = _FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = ""
            out.append("")
        elif m:
            fence = m.group(1)
            out.append("")
        else:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's Markdown text (github-slugger on the rendered text)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    kept = "".join(c for c in text.lower() if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a Markdown file offers."""
    text = path.read_text()
    seen: Counter[str] = Counter()
    out: set[str] = set(_HTML_ANCHOR.findall(text))
    for line in _prose_lines(text):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        out.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
        seen[base] += 1
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in the file's prose."""
    prose = "\n".join(_prose_lines(path.read_text()))
    # code spans hide their content, keeping the newlines (a span may cross lines)
    prose = _CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), prose)
    found = [(m.start(), m.group(1)) for m in _INLINE_LINK.finditer(prose)]
    found += [(m.start(), m.group(1)) for m in _REF_DEF.finditer(prose)]
    return [(prose.count("\n", 0, pos) + 1, target) for pos, target in sorted(found)]


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with each relative link of ``path``: a missing file or an anchor its target lacks."""
    bad = []
    for line, target in links(path):
        if not target or _SCHEME.match(target) or target.startswith("//"):
            continue
        where = f"{path.relative_to(root)}:{line}: ({target})"
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if file_part.startswith("/") or not dest.is_relative_to(root.resolve()):
            bad.append(f"{where} leaves the repository")
            continue
        if not dest.exists():
            bad.append(f"{where} no such file")
            continue
        if anchor:
            if dest.suffix != ".md" or dest.is_dir():
                bad.append(f"{where} an anchor into a file that is not Markdown")
            elif unquote(anchor) not in anchors(dest):
                bad.append(f"{where} {dest.relative_to(root.resolve())} has no heading #{anchor}")
    return bad


FILES = markdown_files()


def test_the_check_covers_the_documentation() -> None:
    names = {str(p.relative_to(ROOT)) for p in FILES}
    assert {"README.md", "CHANGELOG.md", "docs/README.md", "docs/architecture.md"} <= names
    assert any(n.startswith("manifests/examples/") for n in names)
    assert not any(".venv" in n or n.startswith("build/") for n in names)


@pytest.mark.parametrize("path", [pytest.param(p, id=str(p.relative_to(ROOT))) for p in FILES])
def test_every_relative_link_and_anchor_resolves(path: Path) -> None:
    bad = broken_links(path)
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_the_readme_stays_short() -> None:
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_MAX_BYTES, (
        f"README.md is {size} bytes; move detail into docs/ (at most {README_MAX_BYTES})"
    )


def test_every_docs_page_is_in_the_index() -> None:
    index = ROOT / "docs" / "README.md"
    linked = {(index.parent / t.partition("#")[0]).resolve() for _, t in links(index)}
    pages = {p.resolve() for p in (ROOT / "docs").rglob("*.md") if p != index}
    assert not pages - linked, f"docs pages the index does not link: {sorted(pages - linked)}"


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        pytest.param("Updating `flexnpu-daemon`", "updating-flexnpu-daemon", id="code-span"),
        pytest.param("Aclservers' bounds", "aclservers-bounds", id="apostrophe"),
        pytest.param("1. Get the image to every node", "1-get-the-image-to-every-node", id="numbered"),
        pytest.param(
            "The webhook: refused at `kubectl apply`", "the-webhook-refused-at-kubectl-apply", id="colon"
        ),
        pytest.param("Extended resources (no claim)", "extended-resources-no-claim", id="parentheses"),
        pytest.param("Fact → file", "fact--file", id="symbol-between-spaces"),
        pytest.param(
            "`flexnpu_wire` and [the C client](x.md)", "flexnpu_wire-and-the-c-client", id="link-text"
        ),
        pytest.param("Round trip, C client", "round-trip-c-client", id="comma"),
    ],
)
def test_slugs_follow_github(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_the_check_finds_broken_links(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Same\n\n## Same\n\n```md\n## In code\n```\n")
    doc = tmp_path / "README.md"
    doc.write_text(
        "[ok](docs/page.md) [ok](docs/page.md#same-1) [ok](#top) [web](https://example.com/x.md)\n"
        "# Top\n"
        "[gone](docs/nothere.md) [anchor](docs/page.md#same-2) [code](docs/page.md#in-code)\n"
        "`[not a link](nothere.md)`\n\n```\n[not a link](nothere.md)\n```\n"
        "[self](#nowhere) [out](../outside.md)\n\n[ref]: docs/missing.md\n"
    )
    bad = broken_links(doc, root=tmp_path)
    assert [b.split(": (")[1].split(")")[0] for b in bad] == [
        "docs/nothere.md",
        "docs/page.md#same-2",
        "docs/page.md#in-code",
        "#nowhere",
        "../outside.md",
        "docs/missing.md",
    ], bad
