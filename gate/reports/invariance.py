"""Renderers for `gate invariance`: pure functions of an `InvarianceResult` (JSON, rich text,
Markdown, a self-contained HTML heat map). Every figure printed is a field of the result."""

from __future__ import annotations

import html
import io

import orjson
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from gate.core.verdict.invariance import (
    BITWISE_INVARIANT,
    INVARIANT_WITHIN_NOISE,
    NOT_RUN,
    VARIES,
    CellResult,
    InvarianceResult,
)
from gate.core.verdict.result import DEFECT, EXACT_TIE, NEAR_TIE
from gate.reports._common import VERDICT_LABELS, fmt_mnats, markdown_text
from gate.text import printable

VERDICT_WORDS = {
    BITWISE_INVARIANT: "bit-identical",
    INVARIANT_WITHIN_NOISE: "within noise",
    VARIES: "varies",
    NOT_RUN: "not run",
}
_STYLE = {BITWISE_INVARIANT: "green", INVARIANT_WITHIN_NOISE: "yellow", VARIES: "bold red", NOT_RUN: "dim"}


def render_invariance_json(result: InvarianceResult) -> str:
    return orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2).decode("utf-8") + "\n"


def _schedule(cell: CellResult) -> str:
    knobs = ", ".join(f"{k}={v}" for k, v in cell.schedule.knobs.items())
    return printable(knobs or "as the baseline")


def _flips(cell: CellResult) -> str:
    f = cell.token_flips
    return f"{f.get(EXACT_TIE, 0)} / {f.get(NEAR_TIE, 0)} / {f.get(DEFECT, 0)}"


def _pin(cell: CellResult) -> str:
    if cell.pin is None:
        return "—"
    c = cell.pin.counts
    return f"{VERDICT_LABELS.get(cell.pin.verdict, cell.pin.verdict)} ({c['strict_pass']}/{c['prompts']} strict)"


def _bitwise(cell: CellResult) -> str:
    if not cell.ran:
        return "—"
    if cell.bitwise_identical:
        return "yes"
    return f"no ({cell.prompts_differing} of {cell.prompts} prompts)"


def _head(result: InvarianceResult) -> str:
    base = ", ".join(f"{k}={v}" for k, v in result.baseline.knobs.items())
    lines = [
        f"Schedule invariance of engine {result.engine} on {result.model}",
        f"baseline: {base or 'the engine defaults'}"
        + (
            f"; against the pin: {VERDICT_LABELS.get(result.baseline_pin.verdict, result.baseline_pin.verdict)} "
            f"({result.baseline_pin.counts['strict_pass']}/{result.baseline_pin.counts['prompts']} strict, "
            f"{result.baseline_pin.counts['defects']} defect(s))"
            if result.baseline_pin is not None
            else ""
        ),
        "schedule knobs the engine states: "
        + (", ".join(f"{k} (--engine-opt {v})" for k, v in result.knobs.items()) or "none"),
    ]
    return printable("\n".join(lines))


def invariance_renderable(result: InvarianceResult) -> RenderableType:
    table = Table(show_edge=False, title="Each cell against its reference run", title_justify="left")
    for name, justify in (
        ("cell", "left"),
        ("schedule", "left"),
        ("verdict", "left"),
        ("positions", "right"),
        ("bit-identical", "left"),
        ("flips e/n/d", "right"),
        ("max |Δ| mnats", "right"),
        ("against the pin", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for cell in result.cells:
        verdict = cell.verdict
        if not cell.ran:
            table.add_row(
                cell.schedule.cell,
                _schedule(cell),
                Text(f"not run: {cell.reason}", style=_STYLE[NOT_RUN]),
                "",
                "",
                "",
                "",
                "",
            )
            continue
        table.add_row(
            cell.schedule.cell,
            _schedule(cell),
            Text(VERDICT_WORDS[verdict], style=_STYLE[verdict]),
            str(cell.positions),
            _bitwise(cell),
            _flips(cell),
            fmt_mnats(cell.max_abs_delta_mnats),
            _pin(cell),
        )
    notes = Text()
    for cell in result.ran:
        for d in cell.flips[:3]:
            gap = fmt_mnats(d.oracle_minus_candidate_mnats)
            notes.append(
                printable(
                    f"{cell.schedule.cell}: prompt {d.prompt_id!r} position {d.position}: {d.cls.replace('_', ' ')}, "
                    f"{d.oracle_token} -> {d.candidate_token} (the reference's gap {gap} mnats)\n"
                )
            )
        if cell.drift is not None and cell.drift.beyond:
            notes.append(printable(f"{cell.schedule.cell}: {cell.drift.line()}: beyond the doctrine\n"))
        if cell.reuse_note is not None:
            notes.append(printable(f"{cell.schedule.cell}: {cell.reuse_note}\n"))
    for note in result.notes:
        notes.append(printable(f"note: {note}\n"))
    style = _STYLE[result.verdict]
    return Group(Text(_head(result)), table, notes, Text(printable(result.summary), style=style))


def print_invariance(result: InvarianceResult, console: Console) -> None:
    console.print(invariance_renderable(result))


def render_invariance_text(result: InvarianceResult, width: int = 140) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, highlight=False, soft_wrap=False).print(
        invariance_renderable(result)
    )
    return buf.getvalue()


def _md(text: str) -> str:
    return markdown_text(text)


def render_invariance_markdown(result: InvarianceResult) -> str:
    out = [f"## gate invariance: {_md(result.verdict)}", "", _md(result.summary), ""]
    out += [f"- {_md(line)}" for line in _head(result).splitlines()]
    out += [
        "",
        "| cell | schedule | verdict | positions | bit-identical | flips e/n/d | max \\|Δ\\| mnats | against the pin |",
        "|---|---|---|---:|---|---:|---:|---|",
    ]
    for cell in result.cells:
        if not cell.ran:
            reason = _md(cell.reason or "")
            out.append(f"| {_md(cell.schedule.cell)} | {_md(_schedule(cell))} | not run: {reason} | | | | | |")
            continue
        out.append(
            f"| {_md(cell.schedule.cell)} | {_md(_schedule(cell))} | {VERDICT_WORDS[cell.verdict]} "
            f"| {cell.positions} | {_bitwise(cell)} | {_flips(cell)} | {fmt_mnats(cell.max_abs_delta_mnats)} "
            f"| {_md(_pin(cell))} |"
        )
    out += [""] + [f"> {_md(c.schedule.cell)}: {_md(c.reuse_note)}" for c in result.ran if c.reuse_note]
    out += [""] + [f"> note: {_md(n)}" for n in result.notes]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- HTML


def _heat(cell: CellResult, worst: float) -> str:
    """A cell's colour: green when bit-identical, amber to red with its largest |Δ| (on a
    log scale up to the matrix's worst), red when it varies, grey when it did not run."""
    if not cell.ran:
        return "#d0d0d0"
    if cell.verdict == VARIES:
        return "#c62828"
    if cell.bitwise_identical:
        return "#2e7d32"
    import math

    delta = cell.max_abs_delta_mnats or 0.0
    share = math.log1p(delta) / math.log1p(worst) if worst > 0 else 0.0
    red = int(255 - 20 * share)
    green = int(214 - 120 * share)
    return f"#{red:02x}{green:02x}30"


def render_invariance_html(result: InvarianceResult) -> str:
    esc = html.escape
    worst = max((c.max_abs_delta_mnats or 0.0 for c in result.ran), default=0.0)
    tiles = []
    for cell in result.cells:
        verdict = cell.verdict
        detail = (
            f"not run: {cell.reason}"
            if not cell.ran
            else f"{cell.positions} positions; flips e/n/d {_flips(cell)}; "
            f"max |Δ| {fmt_mnats(cell.max_abs_delta_mnats)} mnats; bit-identical {_bitwise(cell)}; "
            f"against the pin {_pin(cell)}"
        )
        tiles.append(
            f'<div class="tile" style="background:{_heat(cell, worst)}" title="{esc(printable(detail))}">'
            f"<b>{esc(cell.schedule.cell)}</b><span>{esc(_schedule(cell))}</span>"
            f"<span>{esc(VERDICT_WORDS[verdict])}</span>"
            f"<span>{esc(fmt_mnats(cell.max_abs_delta_mnats)) + ' mnats' if cell.ran else ''}</span></div>"
        )
    rows = []
    for cell in result.cells:
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{esc(printable(v))}</td>"
                for v in (
                    cell.schedule.cell,
                    _schedule(cell),
                    VERDICT_WORDS[cell.verdict] if cell.ran else f"not run: {cell.reason}",
                    str(cell.positions) if cell.ran else "",
                    _bitwise(cell),
                    _flips(cell) if cell.ran else "",
                    fmt_mnats(cell.max_abs_delta_mnats) if cell.ran else "",
                    _pin(cell),
                )
            )
            + "</tr>"
        )
    head = "".join(f"<p>{esc(line)}</p>" for line in _head(result).splitlines())
    lines = [f"{c.schedule.cell}: {c.reuse_note}" for c in result.ran if c.reuse_note]
    lines += [f"note: {n}" for n in result.notes]
    notes = "".join(f"<p class='note'>{esc(printable(n))}</p>" for n in lines)
    title = esc(f"gate invariance: {result.engine} on {result.model}")
    # Composed by concatenation of escaped parts: no text from the result is a template.
    return "".join(
        [
            '<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>',
            title,
            "</title>\n<style>",
            _CSS,
            "</style></head><body>\n<h1>",
            title,
            "</h1>\n<p><b>",
            esc(result.verdict),
            "</b>: ",
            esc(printable(result.summary)),
            "</p>\n",
            head,
            '\n<div class="grid">',
            "".join(tiles),
            "</div>\n",
            _TABLE_HEAD,
            "".join(rows),
            "</table>\n",
            notes,
            _LEGEND,
            "</body></html>\n",
        ]
    )


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(11em, 1fr)); gap: .5em; margin: 1em 0; }
.tile { color: #fff; padding: .6em; border-radius: .3em; display: flex; flex-direction: column; font-size: .9em; }
.tile span { opacity: .95; }
table { border-collapse: collapse; font-size: .9em; }
td, th { border: 1px solid #ccc; padding: .25em .5em; text-align: left; }
.note { color: #555; }
"""

_TABLE_HEAD = """<table><tr><th>cell</th><th>schedule</th><th>verdict</th><th>positions</th><th>bit-identical</th>
<th>flips e/n/d</th><th>max |&Delta;| mnats</th><th>against the pin</th></tr>"""

_LEGEND = """<p class="note">Colour: green bit-identical; amber to red with the cell's largest |&Delta;logprob|
(log scale, up to the matrix's worst); red: varies (a defect flip, or drift beyond the doctrine); grey: not run.</p>
"""
