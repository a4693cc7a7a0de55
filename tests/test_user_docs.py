"""The pages in docs/ are for users: how to use the library and what holds.

History (session numbers, commit hashes, "before this fix") lives in the git log and the
issues, not in the pages; a page never carries a merge's conflict markers; and the
performance page stays a page a newcomer reads, with its table as the benchmark prints it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.harness import HEADERS

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(DOCS.glob("*.md"))
#: Pages rewritten as user documents; kept so by the checks below.
USER_PAGES = ("performance.md", "postgres.md", "reliability.md")

CONFLICT = re.compile(r"^(<<<<<<<|=======|>>>>>>>)( |$)", re.M)
SESSION = re.compile(r"\b[Ss]ession \d+\b")
#: A commit hash as one is quoted: 7 to 40 hex digits with at least one digit and one letter.
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_carries_conflict_markers(page: Path) -> None:
    found = [m.group(0) for m in CONFLICT.finditer(page.read_text(encoding="utf-8"))]
    assert found == [], f"{page.name} holds unresolved merge markers: {found}"


@pytest.mark.parametrize("name", USER_PAGES)
def test_user_pages_tell_no_history(name: str) -> None:
    text = (DOCS / name).read_text(encoding="utf-8")
    assert SESSION.findall(text) == [], f"{name} names work sessions; the git log holds those"
    assert COMMIT.findall(text) == [], f"{name} quotes commit hashes; the git log holds those"


def test_the_history_checks_catch_what_they_are_for() -> None:
    assert SESSION.search("### PostgreSQL, session 7: the floor")
    assert COMMIT.findall("on commit 3e84158 (main's code), see 0ea00df") == ["3e84158", "0ea00df"]
    assert COMMIT.findall("fdatasync, 1,000,000 events, 2026-12-01, deadbeef, 12345678") == []
    assert CONFLICT.findall("text\n<<<<<<< HEAD\nours\n=======\ntheirs\n>>>>>>> branch\n")


def test_the_performance_page_is_short_and_its_table_is_the_benchmarks_own() -> None:
    text = (DOCS / "performance.md").read_text(encoding="utf-8")
    lines = text.count("\n")
    assert lines <= 300, f"docs/performance.md has {lines} lines; keep it to 300 (history goes to the git log)"
    # Printed by `python -m benchmarks --from run.json --markdown`, not typed by hand.
    assert "| " + " | ".join(HEADERS) + " |" in text
    assert "python -m benchmarks --from" in text
