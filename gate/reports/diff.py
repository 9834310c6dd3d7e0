"""Reports of `gate diff BASE NEW` (`gate.core.verdict.diff.ReportDiff`): rich for the
terminal, JSON, and Markdown short enough to be a pull-request comment (lists past a few
rows fold into <details>). Pure: `result -> str`, save `print_diff`.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gate.core.verdict.diff import ReportDiff, ReportDivergence, ReportFigures
from gate.reports._common import VERDICT_LABELS, fmt_mnats
from gate.reports.markdown import cell

# Rows a Markdown list shows before the rest folds away (a comment fits on a screen).
OPEN_ROWS = 8
TEXT_WIDTH = 100


def render_diff_json(diff: ReportDiff) -> str:
    return orjson.dumps(diff.to_dict(), option=orjson.OPT_INDENT_2).decode("utf-8") + "\n"


# --------------------------------------------------------------------------- figures


def _rate(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f}%"


def figure_rows(diff: ReportDiff) -> list[tuple[str, str, str]]:
    """(figure, before, after) for each distribution figure either report has."""
    b, n = diff.base.distribution, diff.new.distribution
    if b is None and n is None:
        return []

    def get(f: ReportFigures | None, pick: Callable[[ReportFigures], float | None], fmt: Callable[..., str]) -> str:
        return "—" if f is None else fmt(pick(f))

    picks = [
        ("mean KL (mnats)", get(b, lambda f: f.kl_mean_mnats, fmt_mnats), get(n, lambda f: f.kl_mean_mnats, fmt_mnats)),
        ("p99 KL (mnats)", get(b, lambda f: f.kl_p99_mnats, fmt_mnats), get(n, lambda f: f.kl_p99_mnats, fmt_mnats)),
        ("same top", get(b, lambda f: f.same_top_rate, _rate), get(n, lambda f: f.same_top_rate, _rate)),
    ]
    rows = [r for r in picks if r[1:] != ("—", "—")]
    if not rows:
        return []

    def floor(f: ReportFigures | None) -> str:
        if f is None:
            return "—"
        if f.beyond:
            return "beyond"
        return "within" if f.judged else "not judged"

    rows.append(("against the pin's floor", floor(b), floor(n)))
    return rows


def _div_line(d: ReportDivergence) -> str:
    cand = "ran out" if d.candidate_token is None else str(d.candidate_token)
    return f"{d.where()}: oracle {d.oracle_token}, candidate {cand}, top-2 gap {fmt_mnats(d.top2_gap_mnats)} mnats"


def sections(diff: ReportDiff) -> list[tuple[str, list[str]]]:
    """(heading, lines) for each non-empty list of changes, worst first."""
    out = [
        ("Defects added", [_div_line(d) for d in diff.defects_added]),
        ("No longer ratified", [repr(p) for p in diff.no_longer_ratified]),
        ("Class changed", [c.line() for c in diff.class_changes]),
        ("Newly diverging", [repr(p) for p in diff.newly_diverging]),
        ("Fixed (strict again)", [repr(p) for p in diff.fixed]),
        ("Ratified again", [repr(p) for p in diff.ratified_again]),
        ("Defects removed", [_div_line(d) for d in diff.defects_removed]),
    ]
    return [(h, lines) for h, lines in out if lines]


# --------------------------------------------------------------------------- markdown


def render_diff_markdown(diff: ReportDiff) -> str:
    icon = "❌" if diff.worse else "✅"
    head = "worse than the base" if diff.worse else "not worse than the base"
    b, n = diff.base, diff.new
    lines = [
        f"## {icon} gate diff: {head}",
        "",
        f"**{cell(diff.summary)}**",
        "",
        f"base: {VERDICT_LABELS.get(b.verdict, b.verdict)} — {cell(b.summary)}  ",
        f"new: {VERDICT_LABELS.get(n.verdict, n.verdict)} — {cell(n.summary)}",
        "",
    ]
    if diff.worse:
        lines += [*(f"- **{cell(w)}**" for w in diff.worse), ""]
    for heading, rows in sections(diff):
        shown = [f"- {cell(r)}" for r in rows]
        if len(shown) > OPEN_ROWS:
            rest = shown[OPEN_ROWS:]
            shown = [
                *shown[:OPEN_ROWS],
                "",
                f"<details><summary>{len(rest)} more</summary>",
                "",
                *rest,
                "",
                "</details>",
            ]
        lines += [f"**{heading}** ({len(rows)})", "", *shown, ""]
    figures = figure_rows(diff)
    if figures:
        lines += ["| distribution | base | new |", "|---|---|---|"]
        lines += [f"| {f} | {cell(x)} | {cell(y)} |" for f, x, y in figures]
        lines.append("")
    lines += [f"> {cell(note)}" for note in diff.notes]
    return "\n".join(lines).rstrip("\n") + "\n"


# --------------------------------------------------------------------------- terminal


def print_diff(diff: ReportDiff, console: Console) -> None:
    def line(text: str, style: str = "") -> None:
        # Every line whole (soft wrap): a line of the diff is one finding, found by grep.
        console.print(Text(text, style=style), soft_wrap=True)

    line(diff.summary, "bold red" if diff.worse else "bold green")
    for label, report in (("base", diff.base), ("new", diff.new)):
        line(f"{label}: {report.path}: {VERDICT_LABELS.get(report.verdict, report.verdict)}")
        if report.summary:
            line(f"  {report.summary}")
    for w in diff.worse:
        line(f"worse: {w}", "red")
    for heading, items in sections(diff):
        line(f"{heading} ({len(items)})", "bold")
        for item in items:
            line(f"  {item}")
    figures = figure_rows(diff)
    if figures:
        table = Table(title="Distribution", title_justify="left")
        for col in ("figure", "base", "new"):
            table.add_column(col)
        for row in figures:
            table.add_row(*row)
        console.print(table)
    for note in diff.notes:
        line(f"note: {note}", "dim")


def render_diff_text(diff: ReportDiff, *, width: int = TEXT_WIDTH) -> str:
    buf = io.StringIO()
    console = Console(
        file=buf, width=width, color_system=None, force_terminal=False, highlight=False, emoji=False, soft_wrap=False
    )
    print_diff(diff, console)
    return buf.getvalue()
