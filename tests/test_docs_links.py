"""Links in README.md and docs/*.md lead somewhere: a link cannot rot unnoticed.

Checked in every document:

- each relative Markdown link or image, ``[text](path#anchor)``: the file exists, and the
  anchor is a heading of that file (GitHub's anchors: lower case, punctuation dropped, spaces
  to hyphens, ``-1``, ``-2`` ... on repeats);
- each path of the repository named in the text, ``docs/X.md``, ``mrc/transport/limits.py``,
  ``tools/bench_qp.py`` ...: it exists (paths with a wildcard or a placeholder are patterns,
  not files, and are skipped);
- each section named by title after a document, ``docs/EV_HEALTH.md, "Link state"``,
  ``(PERFORMANCE.md, "Bursts")`` or ``(README, "Library")``: the document has a heading, a
  bold run-in title (``**Latecomers** ...``) or a label line (``Evidence of loss (#3):``) that
  starts with that title.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_PATH = re.compile(r"(?<![\w./~$-])((?:docs|mrc|tools|tests|examples|docker|\.ci)/[\w./*{}<>-]*)")
_SECTION = re.compile(r"([\w./-]*\b[A-Z][A-Z_]*\.md|\bREADME),\s+\"([^\"]+)\"")


def _slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def headings(path: Path) -> list[str]:
    """The titles of a Markdown file's headings, outside code blocks."""
    text = _FENCE.sub("", path.read_text())
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)]


def sections(path: Path) -> list[str]:
    """What a reference by title can name in a Markdown file: its headings, its bold run-in
    titles (``**Host queues.** The tbf ...``) and the lines that label what follows
    (``Evidence of loss (#3):``), outside code blocks."""
    text = _FENCE.sub("", path.read_text())
    bold = re.findall(r"\*\*([^*]+)\*\*", text)
    lines = [line.strip() for line in text.splitlines() if line.rstrip().endswith(":")]
    return [*headings(path), *bold, *lines]


def anchors(path: Path) -> set[str]:
    """GitHub's anchor of every heading of a Markdown file."""
    seen: dict[str, int] = {}
    out = set()
    for title in headings(path):
        slug = _slug(title)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(doc: Path, repo: Path = REPO) -> list[str]:
    """What is wrong with ``doc``'s links, one line each (an empty list: nothing); ``repo`` is
    the root that paths named in the text start from."""
    text = doc.read_text()
    prose = _FENCE.sub("", text)
    problems = []
    for m in _LINK.finditer(prose):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            problems.append(f"link to {target}: no {os.path.relpath(dest, repo)}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"link to {target}: no heading with anchor #{anchor} in {dest.name}")
    for m in _PATH.finditer(text):  # code blocks too: the commands in them name real files
        path = m.group(1).rstrip(".,:;")
        if any(c in path for c in "*{}<>"):
            continue
        if not (repo / path).exists():
            problems.append(f"names {path}, which does not exist")
    for m in _SECTION.finditer(" ".join(prose.split())):
        name, title = m.groups()
        named = _resolve_doc(doc, name, repo)
        if named is None:
            problems.append(f"names {name}, which does not exist")
        elif not any(h.lower().startswith(title.lower()) for h in sections(named)):
            problems.append(f'names {name}, "{title}": no such section in {named.name}')
    return problems


def _resolve_doc(doc: Path, name: str, repo: Path) -> Path | None:
    """A document named in ``doc``: from the repository's root, from ``doc``'s folder, or a
    bare name in docs/."""
    if name == "README":  # (README, "Library")
        name = "README.md"
    for base in (repo, doc.parent, repo / "docs"):
        if (base / name).is_file():
            return base / name
    return None


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(REPO)) for d in DOCS])
def test_links_lead_somewhere(doc: Path) -> None:
    problems = broken_links(doc)
    assert not problems, f"{doc.relative_to(REPO)}:\n  " + "\n  ".join(problems)


def test_the_checker_sees_a_broken_link(tmp_path: Path) -> None:
    """A document with one of each kind of rot fails, line by line; its sound links pass."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "real_tool.py").write_text("")
    (tmp_path / "README.md").write_text("# Read me\n")
    (tmp_path / "docs" / "PROTOCOL.md").write_text("# The protocol\n\n## 11. Security block\n")
    doc = tmp_path / "docs" / "GUIDE.md"
    doc.write_text(
        "# Title\n\n"
        "[gone](NOWHERE.md) and [bad anchor](PROTOCOL.md#no-such-heading)\n"
        "[fine](../README.md#read-me) [fine too](#title) [and](PROTOCOL.md#11-security-block)\n"
        "tools/real_tool.py is here, tools/no_such_tool.py is not;\n"
        'docs/PROTOCOL.md, "11. Security" is, docs/PROTOCOL.md, "No such section" is not\n'
    )
    problems = broken_links(doc, tmp_path)
    assert len(problems) == 4, problems
    assert "NOWHERE.md" in problems[0]
    assert "#no-such-heading" in problems[1]
    assert "tools/no_such_tool.py" in problems[2]
    assert "No such section" in problems[3]


def test_github_anchors() -> None:
    assert _slug("11. Security block (S bit)") == "11-security-block-s-bit"
    assert _slug("`--json`") == "--json"
    assert (
        _slug("Issue 20's aims, measured on 2026-11-27") == "issue-20s-aims-measured-on-2026-11-27"
    )
