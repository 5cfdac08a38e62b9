"""Every document and file the docs point a reader to is in this repository: relative links in
every Markdown file, and the repository paths the README and docs/ name in backticks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# a path into the repository, as the docs write one: `docs/x.md`, `kai_ray/core/state.py`
NAMED = re.compile(r"`((?:docs|kai_ray|tests|benchmarks|native|scripts|tools|charts|operator)/"
                   r"[\w./-]+\.(?:md|py|rs|yaml|toml|txt|sh))`")


def _markdown() -> list[Path]:
    found = [*ROOT.glob("*.md"), *ROOT.glob("docs/*.md"), *ROOT.glob("charts/**/*.md")]
    assert len(found) > 10, found  # the walk itself found the docs
    return found


def test_relative_links_resolve() -> None:
    broken = []
    for md in _markdown():
        for match in LINK.finditer(md.read_text()):
            target = match.group(1)
            if re.match(r"[a-z]+:", target):  # a URL
                continue
            if not (md.parent / target).exists():
                broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert broken == []


def test_named_paths_exist() -> None:
    missing = []
    for md in [ROOT / "README.md", *ROOT.glob("docs/*.md")]:
        for match in NAMED.finditer(md.read_text()):
            if not (ROOT / match.group(1)).exists():
                missing.append(f"{md.relative_to(ROOT)}: {match.group(1)}")
    assert missing == []


def test_a_missing_file_is_found() -> None:
    """The patterns themselves: a link and a named path to files that are not there."""
    text = "see [the guide](no-such-guide.md) and `docs/no-such-page.md`"
    assert [m.group(1) for m in LINK.finditer(text)] == ["no-such-guide.md"]
    assert [m.group(1) for m in NAMED.finditer(text)] == ["docs/no-such-page.md"]
