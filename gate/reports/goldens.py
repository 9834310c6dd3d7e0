"""Renderers for `gate goldens check`: pure functions of a `GoldensResult`.

`render_goldens_json`, `render_goldens_markdown` and `render_goldens_text` (the rich report
as plain text) are the formats of `gate.reports.RENDERERS`;
`print_goldens(result, console)` prints the rich report. Wording and number formats are
the core reports' (`gate.reports._common`), so a tie reads the same in every report.
"""

from __future__ import annotations

import io
from typing import Any

import orjson
from rich import box
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from gate.core.goldens.moves import CAUSE_LABELS, NEAR_TIE_FLIP, REAL_CHANGE, TIE_BREAK, GoldenMove, GoldensResult
from gate.reports._common import TIE_BREAK_RULE, doctrine_text, fmt_logprob, token_label
from gate.reports.markdown import cell
from gate.reports.terminal import TEXT_WIDTH
from gate.text import printable

CAUSE_STYLES = {TIE_BREAK: "bold cyan", NEAR_TIE_FLIP: "bold yellow", REAL_CHANGE: "bold red"}
CAUSE_ICONS = {TIE_BREAK: "🟦", NEAR_TIE_FLIP: "🟨", REAL_CHANGE: "🟥"}
VERDICT_STYLES = {"unchanged": "bold green", "accepted": "bold cyan", "moved": "bold red"}
VERDICT_ICONS = {"unchanged": "✅", "accepted": "☑️", "moved": "❌"}
# Past this many moves the rich report lists the rest without their reasons.
MAX_REASONS = 40


# --------------------------------------------------------------------------- shared wording


def old_label(m: GoldenMove) -> str:
    return token_label(m.old_token, m.old_text) if m.old_token is not None else "none (the golden ended)"


def new_label(m: GoldenMove) -> str:
    return token_label(m.new_token, m.new_text) if m.new_token is not None else "none (the new run ended)"


def verdict_line(result: GoldensResult) -> str:
    return f"verdict: {result.verdict} (exit {result.exit_code})"


def head_lines(result: GoldensResult) -> list[str]:
    """Model, engines, golden, pin, doctrine, option changes and notes: one line each."""
    ge, ce = result.golden_engine, result.candidate_engine
    lines = [
        f"model {printable(result.model)}; golden {printable(str(result.golden_path))}"
        + (f" (recorded {result.golden_created_at})" if result.golden_created_at else "")
    ]
    lines.append(
        f"golden engine {ge.get('name', '?')} {ge.get('version', '?')} vs now {ce.get('name', '?')} "
        f"{ce.get('version', '?')}"
    )
    pin = result.pin
    if pin.get("path"):
        lines.append(
            f"causes judged against the pin {pin['path']}"
            + (f" (sha256 {pin['sha256'][:12]})" if pin.get("sha256") else "")
        )
    lines.append(doctrine_text(result.doctrine))
    if result.golden_machine or result.machine:
        keys = result.to_dict()["machine_keys"]
        lines.append(
            f"machine: the golden's {keys['golden']}, now {keys['now']}"
            + (" (another machine: moves within the doctrine pass)" if result.other_machine else "")
        )
    if result.option_changes:
        changed = ", ".join(
            f"{printable(k)} {_option_value(was)} → {_option_value(now)}"
            for k, (was, now) in result.option_changes.items()
        )
        lines.append(f"engine options changed since the golden: {changed}")
    lines += [f"note: {n}" for n in result.notes]
    if result.accepted:
        kept = f"; the old one kept as {result.backup}" if result.backup else ""
        lines.append(f"accepted: {result.accepted} rewritten with the new tokens of the moved prompts{kept}")
    return lines


def _option_value(value: Any) -> str:
    """An option's value as the report shows it: unset is the engine's default."""
    return "(default)" if value is None else printable(repr(value))


# --------------------------------------------------------------------------- JSON


def render_goldens_json(result: GoldensResult) -> str:
    return orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2).decode("utf-8") + "\n"


# --------------------------------------------------------------------------- rich


def goldens_parts(result: GoldensResult, *, max_reasons: int = MAX_REASONS) -> list[RenderableType]:
    parts: list[RenderableType] = [Text("gate goldens check", style="bold")]
    parts += [Text(line, style="dim") for line in head_lines(result)]
    if result.moves:
        parts.append(moves_table(result))
        reasons = Text()
        for m in result.moves[:max_reasons]:
            reasons.append(f"{printable(m.prompt_id)} @ {m.position}", style="bold")
            span = max(m.golden_length, m.candidate_length)
            reasons.append(f" ({m.moved_positions}/{span} positions moved): ")
            reasons.append(m.label, style=CAUSE_STYLES[m.cause])
            reasons.append(f": {m.reason}\n")
        if len(result.moves) > max_reasons:
            reasons.append(f"... and {len(result.moves) - max_reasons} more (see --format json)\n", style="dim")
        if any(m.cause == TIE_BREAK for m in result.moves):
            reasons.append(
                f"At an exact tie the choice is the engine's tie-break rule: {TIE_BREAK_RULE}.\n", style="dim"
            )
        parts.append(reasons)
    parts.append(Text(result.summary, style="bold"))
    parts.append(Text(verdict_line(result), style=VERDICT_STYLES.get(result.verdict, "bold")))
    return parts


def gap_text(x: float | None) -> str:
    """A gap in mnats as short as it stays exact (`0.0`, `93.75`), else to 4 decimals, so
    125.0001 (a real change) never shows as the 125.0 of a near-tie flip."""
    if x is None:
        return "—"
    for digits in (1, 2):
        text = f"{x:.{digits}f}"
        if float(text) == x:
            return text
    return f"{x:.4f}"


def oracle_took(m: GoldenMove) -> str:
    """Which of the two the oracle took there: `old`, `new`, another token, or `—` (no evidence)."""
    if not m.shares_oracle_context or m.oracle_token is None:
        return "—"
    if m.oracle_token == m.old_token:
        return "old"
    if m.oracle_token == m.new_token:
        return "new"
    return token_label(m.oracle_token, m.oracle_text)


def moves_table(result: GoldensResult) -> Table:
    table = Table(title="Moved goldens", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("prompt", overflow="fold", max_width=16)
    table.add_column("pos", justify="right")
    table.add_column("old → new", overflow="fold", min_width=24)
    table.add_column("oracle", overflow="fold")
    table.add_column("old − new", justify="right")
    table.add_column("cause", no_wrap=True, min_width=25)
    for m in result.moves:
        table.add_row(
            printable(m.prompt_id),
            str(m.position),
            f"{old_label(m)} → {new_label(m)}",
            oracle_took(m),
            gap_text(m.gap_mnats),
            Text(m.label, style=CAUSE_STYLES[m.cause]),
        )
    table.caption = (
        "old − new: the oracle's logprob of the old token minus the new's, in mnats; "
        "oracle: which of the two the oracle took (—: the golden had left the oracle's path)"
    )
    table.caption_justify = "left"
    return table


def print_goldens(result: GoldensResult, console: Console) -> None:
    for part in goldens_parts(result):
        console.print(part)


def render_goldens_text(result: GoldensResult, *, width: int = TEXT_WIDTH) -> str:
    """The rich report as plain text: fixed width, no colour, no terminal codes."""
    buf = io.StringIO()
    console = Console(
        file=buf, width=width, color_system=None, force_terminal=False, highlight=False, emoji=False, soft_wrap=False
    )
    print_goldens(result, console)
    return buf.getvalue()


# --------------------------------------------------------------------------- Markdown


def render_goldens_markdown(result: GoldensResult) -> str:
    verdict = result.verdict
    lines = [
        f"## {VERDICT_ICONS.get(verdict, '')} gate goldens: {verdict}",
        "",
        f"**{cell(result.summary)}**",
        "",
        *[f"- {cell(line)}" for line in [verdict_line(result), *head_lines(result)]],
        "",
    ]
    if result.moves:
        lines += [
            "### Moved goldens",
            "",
            "| prompt | position | old (golden) | new | cause | oracle | old logprob | new logprob "
            "| old − new (mnats) | why |",
            "|---|--:|---|---|---|---|--:|--:|--:|---|",
        ]
        for m in result.moves:
            oracle = token_label(m.oracle_token, m.oracle_text) if m.shares_oracle_context else "—"
            lines.append(
                f"| {cell(m.prompt_id)} | {m.position} | {cell(old_label(m))} | {cell(new_label(m))} "
                f"| {CAUSE_ICONS[m.cause]} {cell(CAUSE_LABELS[m.cause])} | {cell(oracle)} "
                f"| {cell(fmt_logprob(m.old_logprob))} | {cell(fmt_logprob(m.new_logprob))} "
                f"| {cell(gap_text(m.gap_mnats))} | {cell(m.reason)} |"
            )
        if any(m.cause == TIE_BREAK for m in result.moves):
            lines += ["", f"Exact ties: the choice is the engine's tie-break rule; {TIE_BREAK_RULE}."]
    return "\n".join(lines) + "\n"
