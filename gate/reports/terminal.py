"""The rich terminal report: a table of prompts, then one panel per divergence laid out for
adjudication, then the spec's summary line and the verdict.

`print_report(result, console)` prints; `render_text(result)` is the same report as plain
text at a fixed width (for `--output` and pipes).
"""

from __future__ import annotations

import io

from rich.console import Console, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.result import (
    DEFECT,
    EXACT_TIE,
    NEAR_TIE,
    RATIFIED_PASS,
    STRICT_PASS,
    Divergence,
    GateResult,
    summary_legend,
)
from gate.reports._common import (
    CLASS_LABELS,
    by_prompt,
    class_counts,
    doctrine_line,
    drift_line,
    fmt_logprob,
    fmt_mnats,
    fmt_ulps,
    for_humans,
    gap_label,
    not_greedy_line,
    provenance_line,
    quote,
    source_label,
    tie_break_line,
    token_label,
    verdict_line,
    why,
)
from gate.reports.distribution import DISTRIBUTION_STYLES, distribution_detail_lines, distribution_summary_lines
from gate.reports.fit import Cell, Column, fitted_table
from gate.reports.profile import profile_lines
from gate.reports.reason import reason
from gate.reports.routing import flip_line
from gate.reports.routing import summary_line as routing_line

CLASS_STYLES = {EXACT_TIE: "bold cyan", NEAR_TIE: "bold yellow", DEFECT: "bold red"}
VERDICT_STYLES = {STRICT_PASS: "bold green", RATIFIED_PASS: "bold cyan", "fail": "bold red"}
# Past these, the report stays readable: full panels for the first divergences, one table
# row for each of the rest; strict prompts are counted rather than listed.
MAX_PANELS = 12
BRIEF_PANELS = 3  # without --details: the first defects, the rest one table row each
MAX_PROMPT_ROWS = 40
TEXT_WIDTH = 100
DETAILS_HINT = "(provenance, the doctrine, the divergence profile and the full distribution figures: --details)"


def print_report(
    result: GateResult,
    console: Console,
    *,
    details: bool = False,
    max_panels: int | None = None,
    max_prompt_rows: int = MAX_PROMPT_ROWS,
) -> None:
    result = for_humans(result)
    parts = report_parts(
        result, width=console.width, details=details, max_panels=max_panels, max_prompt_rows=max_prompt_rows
    )
    for part in parts:
        console.print(part)


def render_text(result: GateResult, *, width: int = TEXT_WIDTH, details: bool = False) -> str:
    """The terminal report as plain text: fixed width, no colour, no terminal codes."""
    buf = io.StringIO()
    console = Console(
        file=buf,
        width=width,
        color_system=None,
        force_terminal=False,
        highlight=False,
        emoji=False,
        soft_wrap=False,
    )
    print_report(result, console, details=details)
    return buf.getvalue()


def report_parts(
    result: GateResult,
    *,
    width: int = TEXT_WIDTH,
    details: bool = False,
    max_panels: int | None = None,
    max_prompt_rows: int = MAX_PROMPT_ROWS,
) -> list[RenderableType]:
    """The verdict and its reason first, then the divergences, then the figures; provenance
    and the long explanations only with `details`; the summary and verdict lines last."""
    style = VERDICT_STYLES.get(result.verdict, "bold")
    parts: list[RenderableType] = [Text(reason(result), style=style)]
    parts.extend(Text(f"warning: {w}", style="bold yellow") for w in result.warnings)
    greedy = not_greedy_line(result)
    if greedy is not None:
        parts.append(Text(greedy, style="bold red"))
    drift = drift_line(result)
    beyond = result.drift is not None and result.drift.beyond
    if drift is not None and beyond:
        parts.append(Text(drift, style="bold red"))
    if details:
        head = Text(result.run.command if result.run is not None else "gate compare", style="bold")
        prov = provenance_line(result)
        if prov:
            head.append(f"  {prov}", style="dim")
        parts += [head, Text(doctrine_line(result), style="dim")]
        if drift is not None and not beyond:
            parts.append(Text(drift, style="dim"))
    divs = list(result.divergences)
    if divs:
        panels = max_panels if max_panels is not None else (MAX_PANELS if details else BRIEF_PANELS)
        prompts = {p.id: p.prompt for p in result.prompts}
        # defects first: the panels show what failed the run
        ordered = sorted(divs, key=lambda d: d.cls != DEFECT)
        shown = ordered[:panels]
        parts.append(
            Text(
                f"Divergences ({len(divs)}; one panel each for the first {len(shown)})"
                if len(divs) > len(shown)
                else f"Divergences ({len(divs)})",
                style="bold",
            )
        )
        for d in shown:
            parts.append(divergence_panel(d, prompts.get(d.prompt_id), result.doctrine))
        if len(divs) > len(shown):
            rest = ordered[len(shown) :]
            parts.append(divergence_table(rest, width=width, title=f"The other {len(rest)} divergences"))
    parts.append(prompt_table(result, width=width, max_rows=max_prompt_rows, all_prompts=details))
    if details:
        parts.extend(Text(line) for line in profile_lines(result))
    if result.routing is not None:
        parts.append(Text(routing_line(result.routing), style="bold magenta"))
    if details:
        parts.extend(Text(line, style=DISTRIBUTION_STYLES[kind]) for line, kind in distribution_detail_lines(result))
    parts.extend(Text(line, style=DISTRIBUTION_STYLES[kind]) for line, kind in distribution_summary_lines(result))
    if not details:
        parts.append(Text(DETAILS_HINT, style="dim"))
    legend = summary_legend(result)
    if legend is not None:
        parts.append(Text(legend, style="dim"))
    parts.append(Text(result.summary, style="bold"))
    parts.append(Text(verdict_line(result), style=style))
    return parts


def _mark(ok: bool) -> Text:
    return Text("yes", style="green") if ok else Text("no", style="red")


def prompt_table(
    result: GateResult, *, width: int = TEXT_WIDTH, max_rows: int = MAX_PROMPT_ROWS, all_prompts: bool = True
) -> Table:
    """One row per prompt that diverged (every prompt with `all_prompts`, up to `max_rows`);
    the strict prompts not listed are counted in the caption."""
    groups = by_prompt(result)
    rows = list(result.prompts)
    diverged = [p for p in rows if not p.strict or groups.get(p.id)]
    if not all_prompts or len(rows) > max_rows:
        rows = diverged[:max_rows]
    hidden = len(result.prompts) - len(rows)
    cells: list[list[Cell]] = []
    for p in rows:
        classified = class_counts(groups.get(p.id, []))
        unadj = f"{p.unadjudicated} unadjudicated" if p.unadjudicated else ""
        note = "; ".join(x for x in (classified, unadj) if x)
        outcome = "strict" if p.strict else ("ratified" if p.ratified else "FAILED")
        cells.append(
            [
                Text(p.id),
                Text(outcome, style="green" if p.strict else ("cyan" if p.ratified else "bold red")),
                f"{p.positions_matched}/{p.positions}",
                "—" if p.first_divergence is None else str(p.first_divergence),
                Text(note or "—", style="red" if not p.ratified else ""),
            ]
        )
    title = "Prompts" if all_prompts and not hidden else f"Prompts that diverged ({len(rows)} of {len(result.prompts)})"
    table = fitted_table(PROMPT_COLUMNS, cells, width, title=title)
    if hidden:
        table.caption = (
            f"{hidden} more prompt{'s' if hidden != 1 else ''} not listed: strict, diverging nowhere"
            if len(diverged) <= len(rows)
            else f"{hidden} more prompts not listed ({len(result.prompts)} in all)"
        )
        table.caption_justify = "left"
    return table


PROMPT_COLUMNS = (
    Column("prompt", shrink=True),
    Column("result"),
    Column("matched", justify="right", drop=1),
    Column("first div.", justify="right", drop=2),
    Column("classified", shrink=True),
)


def divergence_panel(d: Divergence, prompt: str | None, near_tie_mnats: Doctrine | float) -> Panel:
    cls_style = CLASS_STYLES.get(d.cls, "bold")
    title = Text.assemble(
        (f" {d.prompt_id}", "bold"),
        f" · position {d.position} · {source_label(d)} · ",
        (f" {CLASS_LABELS.get(d.cls, d.cls).upper()} ", f"{cls_style} reverse"),
        " ",
    )
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(overflow="fold")
    if prompt is not None:
        grid.add_row("prompt", Text(quote(prompt)))
    grid.add_row(
        "oracle",
        Text.assemble(
            (token_label(d.oracle_token, d.oracle_text), "bold"), f"   logprob {fmt_logprob(d.oracle_logprob)}"
        ),
    )
    cand = Text(token_label(d.candidate_token, d.candidate_text), style="bold")
    if d.candidate_logprob is not None:
        cand.append(f"   logprob {fmt_logprob(d.candidate_logprob)}")
        if d.cls == EXACT_TIE:
            cand.append("   = bit for bit", style=cls_style)
    if d.candidate_rank is not None:
        cand.append(f"   rank {d.candidate_rank} in the oracle's top-k")
    elif d.candidate_token is not None:
        cand.append("   not in the oracle's top-k", style="red")
    grid.add_row("candidate", cand)
    gaps = Text(f"oracle − candidate {gap_label(d)} mnats")
    if d.gap_ulps is not None:
        step = f" of {fmt_mnats(d.ulp_mnats)} mnats" if d.ulp_mnats is not None else ""
        gaps.append(f" ({fmt_ulps(d.gap_ulps)} grid steps{step})")
    gaps.append(f";  top-2 gap {fmt_mnats(d.top2_gap_mnats)} mnats")
    grid.add_row("gaps", gaps)
    verdict = "fails the prompt" if d.cls == DEFECT else "ratified"
    grid.add_row("class", Text(f"{why(d, near_tie_mnats, with_rule=False)} — {verdict}", style=cls_style))
    if d.tie_break is not None:
        grid.add_row("tie-break", Text(tie_break_line(d)))
    if d.routing_flip is not None:
        grid.add_row("routing", Text(flip_line(d.routing_flip), style="magenta"))
    if d.alternatives:
        grid.add_row("oracle top", _alternatives(d))
    return Panel(grid, title=title, title_align="left", border_style=cls_style.replace("bold ", ""), expand=True)


def _alternatives(d: Divergence) -> Table:
    table = Table(box=None, pad_edge=False, show_header=True, header_style="dim")
    table.add_column("#", justify="right")
    table.add_column("token", overflow="fold")
    table.add_column("logprob", justify="right")
    table.add_column("below top (mnats)", justify="right")
    table.add_column("")
    top_lp = d.alternatives[0][1]
    for rank, (tid, lp, text) in enumerate(d.alternatives, start=1):
        mark = ""
        style = ""
        if tid == d.oracle_token:
            mark, style = "oracle", "bold"
        elif tid == d.candidate_token:
            mark, style = "candidate", CLASS_STYLES.get(d.cls, "bold")
        table.add_row(
            str(rank),
            token_label(tid, text),
            fmt_logprob(lp),
            fmt_mnats(1000.0 * (top_lp - lp)),
            Text(mark, style=style),
        )
    return table


DIVERGENCE_COLUMNS = (
    Column("prompt", shrink=True),
    Column("pos", justify="right"),
    Column("class"),
    Column("rule", drop=3, shrink=True),
    Column("oracle", shrink=True),
    Column("candidate", shrink=True),
    Column("o − c mnats", justify="right"),
    Column("source", drop=5),
    Column("top-2 gap", justify="right", drop=4),
    Column("rank", justify="right", drop=6),
    Column("tie-break", drop=7),
)


def divergence_table(divs: list[Divergence], *, width: int = TEXT_WIDTH, title: str = "Divergences") -> Table:
    rows: list[list[Cell]] = [
        [
            d.prompt_id,
            str(d.position),
            Text(CLASS_LABELS.get(d.cls, d.cls), style=CLASS_STYLES.get(d.cls, "")),
            d.rule or "—",
            token_label(d.oracle_token, d.oracle_text),
            token_label(d.candidate_token, d.candidate_text),
            gap_label(d),
            source_label(d),
            fmt_mnats(d.top2_gap_mnats),
            "—" if d.candidate_rank is None else str(d.candidate_rank),
            d.tie_break or "—",
        ]
        for d in divs
    ]
    return fitted_table(DIVERGENCE_COLUMNS, rows, width, title=title)
