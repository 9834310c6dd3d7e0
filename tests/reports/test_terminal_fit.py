"""The terminal report fits its console (100 and 80 columns) without breaking a word inside
a table cell: every cell stays on one line, whole or cut with an ellipsis; columns the
reader can spare are dropped first (as `pip list` and `ruff` do)."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest
from helpers.failing_run import failing_result
from helpers.trace_builders import mixed_result

from gate.core.verdict.result import GateResult
from gate.reports._common import CLASS_LABELS, class_counts, gap_label, token_label
from gate.reports.fit import Column, fitted_table
from gate.reports.terminal import render_text

LONG = "num-squares-of-the-first-ten-integers-written-out"


def cells_of(result: GateResult) -> set[str]:
    """What the prompt and divergence tables put in a cell (the values a reader scans)."""
    out: set[str] = set()
    for p in result.prompts:
        out.add(p.id)
        divs = [d for d in result.divergences if d.prompt_id == p.id]
        if divs:
            out.add(class_counts(divs))
    for d in result.divergences:
        out |= {CLASS_LABELS[d.cls], d.rule, gap_label(d), token_label(d.oracle_token, d.oracle_text)}
        if d.tie_break:
            out.add(d.tie_break)
    return {c for c in out if c and len(c) > 2}


def wide(tmp_path: Path) -> GateResult:
    """The mixed result with long prompt ids and many divergences (a table of the rest)."""
    base = mixed_result(tmp_path)
    ids = {p.id: f"{LONG}-{p.id}" for p in base.prompts}
    prompts = tuple(replace(p, id=ids[p.id]) for p in base.prompts)
    divs = tuple(replace(d, prompt_id=ids[d.prompt_id]) for d in base.divergences)
    return replace(base, prompts=prompts, divergences=divs * 3)


def split_across_lines(value: str, lines: list[str]) -> str | None:
    """The line pair where `value` starts at the end of a cell and goes on in the next
    line (a word or a cell wrapped), if any; a value cut with an ellipsis, or left out with
    its column, is not split."""
    for before, after in pairwise(lines):
        if value in before:
            continue
        for k in range(2, len(value) - 1):
            head, tail = value[:k], value[k:].strip()
            at = before.find(head)
            ends_cell = at >= 0 and (before[at + k : at + k + 1] in ("", " ", "│"))
            inside_word = value[k - 1] != " " and value[k] != " "
            # prose wraps at a space and goes on at the margin; a table cell goes on indented
            indented = after.startswith(" ") or after.startswith("│ ")
            if ends_cell and tail and (" " + tail) in (" " + after.strip(" │")) and (inside_word or indented):
                return f"{before!r} / {after!r}"
    return None


def assert_fits(text: str, width: int, cells: set[str]) -> None:
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines), max(lines, key=len)
    for value in cells:
        where = split_across_lines(value, lines)
        assert where is None, f"cell {value!r} is broken across lines: {where}"


def test_the_check_sees_a_broken_cell() -> None:
    lines = ["num-squar   no    yes", "es                   "]
    assert split_across_lines("num-squares", lines) is not None
    assert split_across_lines("exact tie", ["p1   exact", "     tie  "]) is not None
    assert split_across_lines("num-squares", ["num-squa…   no"]) is None


@pytest.mark.parametrize("width", [100, 80])
@pytest.mark.parametrize("details", [False, True])
def test_tables_fit_without_breaking_a_word(tmp_path: Path, width: int, details: bool) -> None:
    result = wide(tmp_path)
    assert_fits(render_text(result, width=width, details=details), width, cells_of(result))


@pytest.mark.parametrize("width", [100, 80])
def test_the_failing_run_fits(tmp_path: Path, width: int) -> None:
    result = failing_result(tmp_path)
    text = render_text(result, width=width)
    assert_fits(text, width, cells_of(result))
    assert len(text.splitlines()) < 100  # at a glance: not the 342 lines of the old report


def test_columns_are_dropped_least_needed_first() -> None:
    cols = [Column("name"), Column("extra", drop=2), Column("more", drop=1), Column("note", shrink=True)]
    rows = [["alpha", "x" * 20, "y" * 20, "a long note that can be cut"]]
    from io import StringIO

    from rich.console import Console

    def shown(width: int) -> str:
        buf = StringIO()
        Console(file=buf, width=width, color_system=None).print(fitted_table(cols, rows, width))
        return buf.getvalue()

    assert "extra" in shown(200) and "more" in shown(200)
    narrow = shown(60)
    assert "extra" not in narrow and "more" in narrow  # the higher drop goes first
    tight = shown(24)
    assert "more" not in tight and "alpha" in tight and "…" in tight
    assert all(len(line) <= 24 for line in tight.splitlines())
