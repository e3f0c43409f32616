"""The documentation stays true to the code and walkable: docs/settings.md holds what
`server_args.settings_markdown()` renders, the README stays a front door (at most 300 lines), and
every relative link in README.md and docs/*.md reaches a file (and its anchor, a heading there)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from radixlm.runtime.config.server_args import DOCS_BEGIN, DOCS_COMMAND, DOCS_END, settings_markdown

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 300

FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.MULTILINE)


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but `-` and `_` dropped, spaces as `-`,
    a repeated heading numbered `-1`, `-2`, ..."""
    seen: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def test_settings_page_is_generated_from_server_args() -> None:
    text = (ROOT / "docs" / "settings.md").read_text()
    assert DOCS_BEGIN in text and DOCS_END in text, f"docs/settings.md lacks {DOCS_BEGIN} ... {DOCS_END}"
    generated = text.split(DOCS_BEGIN + "\n", 1)[1].split(DOCS_END, 1)[0]
    assert generated == settings_markdown(), (
        "docs/settings.md is out of date with ServerArgs, HELP or runtime/config/envs.py; regenerate it with\n"
        f"    .venv/bin/{DOCS_COMMAND}"
    )


def test_readme_is_a_front_door() -> None:
    num_lines = len((ROOT / "README.md").read_text().splitlines())
    assert num_lines <= README_MAX_LINES, (
        f"README.md has {num_lines} lines (at most {README_MAX_LINES}): move topics to docs/, history to git"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...: not checked here
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked.relative_to(ROOT) if linked.is_relative_to(ROOT) else linked}")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_link_checker_sees_a_broken_link(tmp_path: Path) -> None:
    """The checker's own parts: a heading's anchor, and links in code that are not links."""
    page = tmp_path / "page.md"
    page.write_text("# The `--dtype` flag (auto)\n\n```\n[not](a-link.md)\n```\n`[nor](this.md)` [x](gone.md)\n")
    assert anchors(page) == {"the---dtype-flag-auto"}
    assert LINK.findall(prose(page.read_text())) == ["gone.md"]
