"""Markdown report, fit for a CI job summary (GitHub's `GITHUB_STEP_SUMMARY`).

Pure: `render_markdown(result) -> str`. Token text and prompt ids are escaped so a `|`,
a backtick or a newline in them cannot break a table.
"""

from __future__ import annotations

from gate.core.verdict.result import EXACT_TIE, RATIFIED_PASS, STRICT_PASS, Divergence, GateResult, summary_legend
from gate.reports._common import (
    CLASS_LABELS,
    TIE_BREAK_RULE,
    VERDICT_LABELS,
    by_prompt,
    class_counts,
    doctrine_line,
    drift_line,
    fmt_logprob,
    fmt_mnats,
    for_humans,
    gap_label,
    markdown_code_block,
    markdown_text,
    not_greedy_line,
    provenance_line,
    source_label,
    token_label,
    verdict_line,
)
from gate.reports.distribution import distribution_detail_lines, distribution_markdown
from gate.reports.profile import profile_lines
from gate.reports.reason import reason
from gate.reports.routing import flip_line
from gate.reports.routing import summary_line as routing_line

VERDICT_ICONS = {STRICT_PASS: "✅", RATIFIED_PASS: "☑️", "fail": "❌"}
CLASS_ICONS = {EXACT_TIE: "🟦", "near_tie": "🟨", "defect": "🟥"}
# Past these the tables fold into <details>, so a job summary stays short.
OPEN_ROWS = 25


def cell(text: str) -> str:
    """One table cell or sentence of the report: `markdown_text`, the one escaping of every
    Markdown writer (no live link, image, HTML, mention or reference from any text)."""
    return markdown_text(text)


def render_markdown(result: GateResult) -> str:
    """The verdict and its reason first, then the divergences, then the figures; provenance
    and the long explanations folded in a details section."""
    result = for_humans(result)
    verdict = result.verdict
    lines = [
        f"## {VERDICT_ICONS.get(verdict, '')} gate: {cell(VERDICT_LABELS.get(verdict, verdict))}",
        "",
        f"**{cell(reason(result))}**",
        "",
        f"**{cell(result.summary)}** · exit {result.exit_code}",
        "",
        *([cell(legend), ""] if (legend := summary_legend(result)) is not None else []),
        *(f"> ⚠️ warning: {cell(w)}\n" for w in result.warnings),
    ]
    greedy = not_greedy_line(result)
    if greedy is not None:
        lines += [f"**{cell(greedy)}**", ""]
    drift = drift_line(result)
    if drift is not None and result.drift is not None and result.drift.beyond:
        lines += [f"**{cell(drift)}**", ""]
    if result.divergences:
        lines += _divergence_table(result)
        ties = [d for d in result.divergences if d.cls == EXACT_TIE]
        if ties:
            lines += ["", f"Exact ties: the logprobs are equal bit for bit; {cell(TIE_BREAK_RULE)}."]
        lines.append("")
    lines += _prompt_table(result)
    lines += distribution_markdown(result, cell)
    if result.routing is not None:
        lines += ["", "### MoE routing", "", f"**{cell(routing_line(result.routing))}**", ""]
        for d in result.divergences:
            if d.routing_flip is not None:
                lines.append(f"- {cell(d.prompt_id)} position {d.position}: {cell(flip_line(d.routing_flip))}")
    lines += _details(result, drift)
    return "\n".join(lines) + "\n"


def _details(result: GateResult, drift: str | None) -> list[str]:
    """Provenance, the doctrine, the run's drift, the divergence profile and the full
    distribution figures, folded."""
    prov = provenance_line(result)
    items = [prov, doctrine_line(result), verdict_line(result)]
    if drift is not None and not (result.drift is not None and result.drift.beyond):
        items.append(drift)
    items += profile_lines(result) if result.divergences else []
    figures = [line for line, _ in distribution_detail_lines(result)]
    out = ["", "<details><summary>Details: provenance, doctrine, figures</summary>", ""]
    out += [f"- {cell(x)}" for x in items if x]
    if figures:
        out += ["", *markdown_code_block(figures)]
    return [*out, "", "</details>"]


def _fold(rows: list[str], header: list[str], summary: str) -> list[str]:
    if len(rows) <= OPEN_ROWS:
        return [*header, *rows]
    return [
        *header,
        *rows[:OPEN_ROWS],
        "",
        f"<details><summary>{summary}</summary>",
        "",
        *header,
        *rows[OPEN_ROWS:],
        "",
        "</details>",
    ]


def _prompt_table(result: GateResult) -> list[str]:
    groups = by_prompt(result)
    listed = [p for p in result.prompts if not p.strict or groups.get(p.id)]
    strict = len(result.prompts) - len(listed)
    out = ["### Prompts", ""]
    if not listed:
        return [*out, "The prompt is strict." if strict == 1 else f"All {strict} prompts strict.", ""]
    header = [
        "| prompt | strict | ratified | positions matched | first divergence | classified |",
        "|---|:-:|:-:|--:|--:|---|",
    ]
    rows = []
    for p in listed:
        note = class_counts(groups.get(p.id, []))
        if p.unadjudicated:
            note = f"{note}; {p.unadjudicated} unadjudicated" if note else f"{p.unadjudicated} unadjudicated"
        rows.append(
            f"| {cell(p.id)} | {'yes' if p.strict else 'no'} | {'yes' if p.ratified else '**no**'} "
            f"| {p.positions_matched}/{p.positions} | {p.first_divergence} | {cell(note) or '—'} |"
        )
    out += _fold(rows, header, f"{len(rows) - OPEN_ROWS} more prompts")
    if strict:
        out += ["", f"{strict} other prompt{'s' if strict != 1 else ''} strict (not listed)."]
    return [*out, ""]


def _divergence_row(d: Divergence) -> str:
    cls = f"{CLASS_ICONS.get(d.cls, '')} {CLASS_LABELS.get(d.cls, d.cls)}"
    return (
        f"| {cell(d.prompt_id)} | {d.position} | {cell(source_label(d))} | {cls} "
        f"| {cell(token_label(d.oracle_token, d.oracle_text))} "
        f"| {cell(token_label(d.candidate_token, d.candidate_text))} "
        f"| {cell(fmt_logprob(d.oracle_logprob))} | {cell(fmt_logprob(d.candidate_logprob))} "
        f"| {cell(gap_label(d))} | {cell(fmt_mnats(d.top2_gap_mnats))} "
        f"| {'—' if d.candidate_rank is None else d.candidate_rank} | {d.tie_break or '—'} | {cell(d.rule or '—')} |"
    )


def _divergence_table(result: GateResult) -> list[str]:
    header = [
        "| prompt | position | source | class | oracle | candidate | oracle logprob | candidate logprob "
        "| oracle − candidate (mnats) | top-2 gap (mnats) | rank | tie-break | decided by |",
        "|---|--:|---|---|---|---|--:|--:|--:|--:|--:|---|---|",
    ]
    rows = [_divergence_row(d) for d in result.divergences]
    return ["### Divergences", "", *_fold(rows, header, f"{len(rows) - OPEN_ROWS} more divergences")]
