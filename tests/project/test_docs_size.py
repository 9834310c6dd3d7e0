"""The words stay on a diet: every page of docs/ under 20 KB, docs/ under 250 KB in all (the
seed example's traces included), the README under 10 KB. A page that outgrows its size is
split or cut, never exempted."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KB = 1000
PAGE_LIMIT, DOCS_LIMIT, README_LIMIT = 20 * KB, 250 * KB, 10 * KB


def test_every_docs_page_is_under_20_kb() -> None:
    pages = [p for p in (ROOT / "docs").rglob("*.md")]
    assert pages
    over = {str(p.relative_to(ROOT)): p.stat().st_size for p in pages if p.stat().st_size >= PAGE_LIMIT}
    assert over == {}


def test_docs_are_under_250_kb_in_all() -> None:
    total = sum(p.stat().st_size for p in (ROOT / "docs").rglob("*") if p.is_file())
    assert total < DOCS_LIMIT, f"docs/ holds {total} bytes"


def test_the_readme_is_under_10_kb() -> None:
    size = (ROOT / "README.md").stat().st_size
    assert size < README_LIMIT, f"README.md is {size} bytes"
