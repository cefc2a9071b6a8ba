"""The docs site holds together without building it: every page is in the table of contents, every
link of the README and the pages names a file that exists (and a heading of it, where it names one),
the README stays short, and the TOML examples parse.

`make docs` (Sphinx with -W) fails on the same faults; these checks run in `make test`, where
Sphinx is not installed, and name the page and the link.  Anchors are checked against GitHub's
heading slugs (what a reader of the repository follows; MyST's `myst_heading_anchors` makes the
same ids on the site), so a link works in both places.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
INDEX = DOCS / "index.md"
#: the issue that split the README asked for a README that pitches and points, the manual in docs/
README_MAX_LINES = 150

FENCE = re.compile(r"^(`{3,})(.*?)\n(.*?)^\1\s*$", re.M | re.S)
TOCTREE = re.compile(r"^```\{toctree\}[^\n]*\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def pages() -> list[Path]:
    """Every Markdown page of the site (index.md is its root, not an entry)."""
    return sorted(p for p in DOCS.glob("*.md") if p != INDEX)


def toctree_entries(index: str) -> list[str]:
    """The entries of every toctree block of an index page, in order (options and blank lines out)."""
    out = []
    for block in TOCTREE.findall(index):
        out += [line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith(":")]
    return out


def toctree_faults(index: str, names: set[str]) -> list[str]:
    """Pages in no toctree, and toctree entries that are no page (names: the pages' stems)."""
    entries = toctree_entries(index)
    missing = [f"{n}.md is in no toctree of docs/index.md" for n in sorted(names - set(entries))]
    unknown = [f"docs/index.md's toctree names {e}, which is no page" for e in entries if e not in names]
    twice = [f"docs/index.md's toctree names {e} twice" for e in sorted({e for e in entries if entries.count(e) > 1})]
    return missing + unknown + twice


def without_code(text: str) -> str:
    """The text with its fenced blocks blanked (a link or heading inside code is code)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def prose(text: str) -> str:
    """The text with its fenced blocks and inline code blanked: a link inside code is code."""
    return re.sub(r"`[^`\n]*`", "", without_code(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup out, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a Markdown text (a repeated slug gets -1, -2 ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for _, title in HEADING.findall(without_code(text)):
        s = slug(title)
        out.add(f"{s}-{seen[s]}" if s in seen else s)
        seen[s] = seen.get(s, 0) + 1
    return out


def link_faults(path: Path, text: str) -> list[str]:
    """Each relative link of ``text`` (the file at ``path``) whose file, or heading, does not exist."""
    out = []
    for target in LINK.findall(prose(text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, mailto: ...: not ours to check here
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            out.append(f"{path.relative_to(ROOT)}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            out.append(f"{path.relative_to(ROOT)}: {target}: no such heading in {dest.name}")
    return out


def test_every_page_is_in_the_table_of_contents():
    assert toctree_faults(INDEX.read_text(), {p.stem for p in pages()}) == []


def test_the_toctree_check_names_a_missing_page_and_an_unknown_entry():
    index = "```{toctree}\n:caption: Using\n\ngetting-started\nnowhere\n```\n"
    assert toctree_faults(index, {"getting-started", "plan"}) == [
        "plan.md is in no toctree of docs/index.md", "docs/index.md's toctree names nowhere, which is no page"]


@pytest.mark.parametrize("path", [ROOT / "README.md", *pages()], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_names_a_file_and_heading_that_exist(path):
    assert link_faults(path, path.read_text()) == []


def test_the_link_check_names_a_missing_page_and_a_missing_heading():
    page = DOCS / "plan.md"
    text = ("[ok](cli.md#exit-codes) [gone](no-such-page.md) [bad](cli.md#no-such-heading) "
            "[here](#the-plan) `[not a link](nowhere.md)`\n```\n[in code](nowhere.md)\n```\n")
    assert link_faults(page, text) == ["docs/plan.md: no-such-page.md: no such file",
                                       "docs/plan.md: cli.md#no-such-heading: no such heading in cli.md"]


def test_heading_anchors_are_githubs():
    assert anchors("# A\n## Finding the knee (`mode = \"search\"`)\n## A\n") == {
        "a", "finding-the-knee-mode--search", "a-1"}


def test_the_readme_is_short_and_links_every_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    linked = {Path(t.partition("#")[0]).name for t in LINK.findall(readme) if t.startswith("docs/")}
    assert {p.name for p in pages()} - linked == set()


@pytest.mark.parametrize("path", [ROOT / "README.md", *pages()], ids=lambda p: str(p.relative_to(ROOT)))
def test_the_toml_examples_parse(path):
    for fence, lang, body in FENCE.findall(path.read_text()):
        if lang.strip() == "toml":
            tomllib.loads(body)  # raises, naming the line, where an example is not TOML
