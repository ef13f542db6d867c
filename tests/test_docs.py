"""README.md, docs/ and docker/*.md: every relative link resolves (link text wrapped over lines
included), every page is reachable from the README,
each page opens with its title and one paragraph, and the knob reference keeps the markers
that the generated table will replace. Reads files only; needs no build."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README = REPO / "README.md"

# [text](target) and ![alt](target); the target ends at whitespace or ')'.
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_EXTERNAL = ("http://", "https://", "mailto:")


def pages() -> list[Path]:
    """Every page a user reads: the README, docs/, and the Markdown next to the Docker files."""
    return [README, *sorted(DOCS.glob("*.md")), *sorted((REPO / "docker").glob("*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped (except
    '-' and '_'), spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # links: keep the text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.lower().replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor the headings of `path` define, numbered like GitHub for repeats."""
    seen: dict[str, int] = {}
    result: set[str] = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


# Inline code, which may wrap onto the next line of its paragraph but not past a blank line.
_INLINE_CODE = re.compile(r"`(?:[^`\n]|\n(?![ \t]*\n))*`")


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link outside code, the text of a link wrapped over
    several lines included (the line is the one its '[' is on)."""
    text = path.read_text(encoding="utf-8")
    prose = dict(prose_lines(text))
    lines = [prose.get(n, "") for n in range(1, len(text.splitlines()) + 1)]
    # inline code is not a link; keep its line breaks so that line numbers stay right
    body = _INLINE_CODE.sub(lambda m: "``" + "\n" * m.group(0).count("\n"), "\n".join(lines))
    return [(body.count("\n", 0, m.start()) + 1, m.group(1)) for m in _LINK.finditer(body)]


def broken_links(path: Path, root: Path = REPO) -> list[str]:
    """What is wrong with each relative link of `path` (file missing, anchor missing)."""
    problems: list[str] = []
    for number, target in links(path):
        if target.startswith(_EXTERNAL):
            continue
        file_part, _, anchor = target.partition("#")
        dest = path if not file_part else (path.parent / file_part).resolve()
        where = f"{path.relative_to(root)}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file")
            continue
        if anchor:
            if dest.suffix != ".md" or dest.is_dir():
                problems.append(f"{where}: anchor into a file that is not markdown")
            elif anchor not in anchors(dest):
                problems.append(f"{where}: no heading with anchor #{anchor} in {dest.name}")
    return problems


def test_docs_exist() -> None:
    assert DOCS.is_dir() and len(list(DOCS.glob("*.md"))) >= 5


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    problems = broken_links(page)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_link_check_can_fail(tmp_path: Path) -> None:
    """The checker itself: a missing file and a missing anchor are both reported; a good
    link, a link inside code and an external one are not."""
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading: yes\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#a-code-heading-yes) [self](#page) [web](https://x.org/#y)\n"
        "`[not a link](nowhere.md)`\n```\n[in a fence](nowhere.md)\n```\n"
        "[gone](missing.md) [bad anchor](other.md#nope)\n"
        "text wrapped [over a\nline break](other.md#wrapped) and `code\nwrapped [x](nowhere.md)`\n"
    )
    problems = broken_links(page, root=tmp_path)
    assert len(problems) == 3, problems
    assert "missing.md: no such file" in problems[0]
    assert "no heading with anchor #nope" in problems[1]
    assert "page.md:9: other.md#wrapped: no heading" in problems[2]


def test_readme_links_every_docs_page() -> None:
    linked = {
        (README.parent / t.partition("#")[0]).resolve()
        for _, t in links(README)
        if not t.startswith(_EXTERNAL) and t.partition("#")[0]
    }
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link to: {missing}"


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_docs_page_opens_with_title_and_paragraph(page: Path) -> None:
    """'# Title', a blank line, then a paragraph of prose saying what the page covers."""
    lines = page.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# "), f"{page.name} does not start with a '# ' title"
    assert lines[1] == "" and lines[2] and not lines[2].startswith(("#", "|", "```", "-", "<")), (
        f"{page.name}: the title must be followed by a paragraph saying what the page covers"
    )


def test_readme_stays_short_and_keeps_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 400
    assert "make demo" in text and "make test" in text
    for start in ('init_process_group("ucx")', 'init_process_group("udp")', '"cpu:gloo,cuda:ucx"'):
        assert start in text


def test_knob_reference_is_marked_for_generation() -> None:
    """docs/configuration.md holds the knob table between the markers that the table
    generated from the config schema will replace, under the heading "Knob reference"."""
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert "## Knob reference" in text
    begin, end = text.find("<!-- knobs:begin -->"), text.find("<!-- knobs:end -->")
    assert text.index("## Knob reference") < begin < end
    table = text[begin:end]
    for knob in ("UCXBACKEND_PROGRESS_MODE", "UCXBACKEND_IFNAME", "UCXBACKEND_UDP_CONFIG"):
        assert knob in table
    assert text.count("<!-- knobs:begin -->") == 1 and text.count("<!-- knobs:end -->") == 1


def test_testing_page_describes_every_test_file() -> None:
    """docs/testing.md's "What each file checks" names every tests/test_*.py (eight had
    gone undescribed)."""
    text = (DOCS / "testing.md").read_text(encoding="utf-8")
    section = text[text.index("## What each file checks") :]
    missing = [
        p.name for p in sorted((REPO / "tests").glob("test_*.py")) if f"`{p.name}`" not in section
    ]
    assert not missing, f"test files docs/testing.md does not describe: {missing}"
