"""Every relative link in README.md, BENCHMARKS.md and docs/**/*.md names a file or folder that exists.

Markdown links and images (`[text](target)`, `![alt](target)`) and `<img src="...">` are
checked relative to the file they are in; http(s):// and mailto: links and pure #anchors
are skipped, and a #fragment is dropped before the check. Fenced code blocks and inline
code are not links, so they are skipped too.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMG = re.compile(r"<img\b[^>]*\bsrc\s*=\s*[\"']([^\"']+)[\"']", re.I)
SKIP = re.compile(r"^(https?:|mailto:|#)", re.I)


def links(text: str) -> list[str]:
    """The link targets of a Markdown text, outside code."""
    text = CODE.sub("", FENCE.sub("", text))
    return [m.group(1) for pattern in (LINK, IMG) for m in pattern.finditer(text)]


def broken(page: Path) -> list[str]:
    """The relative links of `page` that name nothing."""
    out = []
    for target in links(page.read_text(encoding="utf-8")):
        if SKIP.match(target):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        if path and not (page.parent / path).exists():
            out.append(target)
    return out


def test_link_finder():
    text = ('[a](docs/x.md) ![b](img/y.png "t") [c](https://e.org) [d](#top) `[e](no.md)`\n'
            '<img src="z.png" width="3">\n```\n[f](nope.md)\n```\n[g [h]](w.md#part)\n')
    assert links(text) == ["docs/x.md", "img/y.png", "https://e.org", "#top", "w.md#part", "z.png"]


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "there.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text('[ok](there.md#s) [no](missing.md) <img src="gone.png"> [web](http://x.org) [up](.)\n')
    assert broken(page) == ["missing.md", "gone.png"]


def test_pages_exist():
    assert (ROOT / "README.md").is_file() and len(PAGES) > 1


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert broken(page) == [], f"{page.relative_to(ROOT)}: links to nothing: {broken(page)}"
