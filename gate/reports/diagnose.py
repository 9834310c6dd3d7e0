"""Renderers for `gate diagnose`: pure functions of a `Diagnosis` (JSON, rich text, HTML).

The rich report is a table with one row per layer (its worst point against that point's
honest band) and the one line that says where the deviation enters; the HTML report draws
every point's error against its band, layer by layer, for both paths, as inline SVG.
"""

from __future__ import annotations

import html
import io
import math

import orjson
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from gate.core.diagnosis.metric import METRIC_TEXT
from gate.core.diagnosis.record import Diagnosis, LayerError, PathFinding, finding_line, times, where_text


def render_diagnosis_json(d: Diagnosis) -> str:
    return orjson.dumps(d.to_dict(), option=orjson.OPT_INDENT_2).decode("utf-8") + "\n"


def by_layer(f: PathFinding) -> list[LayerError]:
    """Each layer's worst point (by ratio), layer order; the first divergent point stands for its layer."""
    worst: dict[int, LayerError] = {}
    for e in f.layers:
        held = worst.get(e.layer)
        if e is f.first or held is None or (held is not f.first and e.ratio > held.ratio):
            worst[e.layer] = e
    return [worst[k] for k in sorted(worst)]


def _head(d: Diagnosis) -> Text:
    head = Text()
    head.append("Diagnosis ", style="bold")
    head.append(f"of {d.model or 'the model'}: prompt {d.prompt_id}, position {d.position} ")
    src = {"given": "named on the command line", "distribution": "the failed distribution's largest KL"}.get(
        d.source, f"{d.source.replace('_', ' ')} divergence"
    )
    cls = f", {d.divergence_class.replace('_', ' ')}" if d.divergence_class else ""
    head.append(f"({src}{cls}), {d.path} path\n")
    head.append(
        f"context: {d.prompt_length} prompt tokens + {d.context_length - d.prompt_length} oracle tokens; "
        f"{d.layer_count} decoder layers\n"
    )
    eng = d.engines
    if eng:
        head.append(
            f"candidate {_engine(eng.get('candidate'))}; reference {_engine(eng.get('reference'))}; "
            f"honest band from {_engine(eng.get('honest'))}\n"
        )
    head.append(f"metric: {METRIC_TEXT}; located where it exceeds {d.margin:g}× the honest band\n")
    if d.gate_failure is not None:
        g = d.gate_failure
        head.append(f"the gate failed: {'; '.join(g.reasons)}; this position is {g.chosen} ({g.path} path)\n")
    return head


def excursion_lines(d: Diagnosis) -> list[str]:
    """The ranked excursions of both paths, one line each, past the margin or not."""
    return [
        f"{i}. {times(e.point.ratio)} at {where_text(e.point, d.layer_count)}, {e.path} path "
        f"({e.point.module}, position {e.point.position})"
        for i, e in enumerate(d.excursions(), start=1)
    ]


def _engine(info: object) -> str:
    if not isinstance(info, dict):
        return "?"
    parts = [str(info.get("class", info.get("name", "?")))]
    if info.get("dtype"):
        parts.append(str(info["dtype"]))
    return " ".join(parts)


def _table(d: Diagnosis, f: PathFinding) -> Table:
    table = Table(show_edge=False, title=f"{f.path} path, worst point of each layer", title_justify="left")
    for col, just in (("layer", "right"), ("part", "left"), ("module", "left"), ("error", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    table.add_column("honest band", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("at pos", justify="right")
    for e in by_layer(f):
        first = f.first is not None and e is f.first
        out = e.ratio > d.margin
        style = "bold red" if first else "red" if out else ""
        layer = "emb" if e.layer < 0 else "head" if e.layer >= d.layer_count else str(e.layer)
        table.add_row(
            layer,
            e.part,
            e.module,
            _sci(e.error),
            _sci(e.honest_band),
            Text(times(e.ratio), style=style),
            str(e.position),
            style="bold" if first else None,
        )
    return table


def diagnosis_renderable(d: Diagnosis) -> RenderableType:
    parts: list[RenderableType] = [_head(d), _table(d, d.finding)]
    if d.finding.missing:
        parts.append(Text(f"not in the candidate's capture: {', '.join(d.finding.missing)}\n"))
    if d.other is not None:
        parts.append(Text(f"{d.other.path} path: {finding_line(d.other, d.margin, d.layer_count)}"))
    ranked = excursion_lines(d)
    if ranked:
        parts.append(Text("largest excursions, both paths (past the margin or not):\n" + "\n".join(ranked)))
    for note in d.notes:
        parts.append(Text(note))
    bad = d.finding.located or d.gate_failure is not None
    parts.append(Text(d.summary, style="bold red" if bad else "bold green"))
    return Group(*parts)


def print_diagnosis(d: Diagnosis, console: Console) -> None:
    console.print(diagnosis_renderable(d))


def render_diagnosis_text(d: Diagnosis, width: int = 120) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, highlight=False, soft_wrap=False).print(diagnosis_renderable(d))
    return buf.getvalue()


def _sci(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.2e}"


# --------------------------------------------------------------------------- HTML

_W, _H, _PAD_L, _PAD_B, _PAD_T = 960, 300, 64, 36, 16


def _svg(d: Diagnosis, f: PathFinding) -> str:
    """Every point's error (red dots joined) and its honest band (grey line), and the margin
    times the band (dashed), on a log scale, points in forward order, layers marked."""
    rows = f.layers
    if not rows:
        return "<p>nothing was compared on this path</p>"
    finite = [v for e in rows for v in (e.error, e.honest_band, e.honest_band * d.margin) if v > 0 and math.isfinite(v)]
    lo = math.floor(math.log10(min(finite)))
    hi = math.ceil(math.log10(max(finite))) + (0 if any(math.isfinite(e.error) for e in rows) else 1)
    hi = max(hi, lo + 1)
    n = len(rows)
    plot_w, plot_h = _W - _PAD_L - 10, _H - _PAD_B - _PAD_T

    def x(i: int) -> float:
        return _PAD_L + (plot_w * i / max(1, n - 1))

    def y(v: float) -> float:
        if not math.isfinite(v):
            return _PAD_T
        v = max(v, 10.0**lo)
        return _PAD_T + plot_h * (hi - math.log10(v)) / (hi - lo)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" width="100%" role="img">']
    for k in range(lo, hi + 1):
        out.append(f'<line x1="{_PAD_L}" x2="{_W - 10}" y1="{y(10.0**k):.1f}" y2="{y(10.0**k):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{_PAD_L - 6}" y="{y(10.0**k) + 4:.1f}" font-size="11" text-anchor="end">1e{k}</text>')
    last_layer = None
    for i, e in enumerate(rows):
        if e.layer != last_layer:
            last_layer = e.layer
            label = "emb" if e.layer < 0 else "head" if e.layer >= d.layer_count else str(e.layer)
            out.append(f'<line x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{_PAD_T}" y2="{_H - _PAD_B}" stroke="#f4f4f4"/>')
            if e.layer < 0 or e.layer >= d.layer_count or e.layer % max(1, d.layer_count // 15) == 0:
                out.append(
                    f'<text x="{x(i):.1f}" y="{_H - _PAD_B + 14}" font-size="10" text-anchor="middle">{label}</text>'
                )
    band = " ".join(f"{x(i):.1f},{y(e.honest_band):.1f}" for i, e in enumerate(rows))
    edge = " ".join(f"{x(i):.1f},{y(e.honest_band * d.margin):.1f}" for i, e in enumerate(rows))
    err = " ".join(f"{x(i):.1f},{y(e.error):.1f}" for i, e in enumerate(rows))
    out.append(f'<polyline points="{band}" fill="none" stroke="#888" stroke-width="2"/>')
    out.append(f'<polyline points="{edge}" fill="none" stroke="#888" stroke-dasharray="5,4"/>')
    out.append(f'<polyline points="{err}" fill="none" stroke="#c62828" stroke-width="1.5"/>')
    for i, e in enumerate(rows):
        colour = "#c62828" if e.ratio > d.margin else "#2e7d32"
        tip = html.escape(f"{e.module} ({e.part}): error {_sci(e.error)}, band {_sci(e.honest_band)}, {times(e.ratio)}")
        dot = f'<circle cx="{x(i):.1f}" cy="{y(e.error):.1f}" r="2.5" fill="{colour}">'
        out.append(f"{dot}<title>{tip}</title></circle>")
    if f.first is not None:
        i = rows.index(f.first)
        ring = f'cx="{x(i):.1f}" cy="{y(f.first.error):.1f}" r="7"'
        out.append(f'<circle {ring} fill="none" stroke="#000" stroke-width="2"/>')
        text = html.escape(f"enters: {where_text(f.first, d.layer_count)} ({times(f.first.ratio)})")
        anchor = "end" if i > n * 0.7 else "start"
        out.append(
            f'<text x="{x(i) + (-10 if anchor == "end" else 10):.1f}" y="{y(f.first.error) + 4:.1f}" '
            f'font-size="13" font-weight="bold" text-anchor="{anchor}">{text}</text>'
        )
    out.append(
        f'<text x="{_PAD_L}" y="{_H - 4}" font-size="11">layer (points in forward order) · red: candidate error · '
        f"grey: honest band · dashed: {d.margin:g}× the band</text>"
    )
    out.append("</svg>")
    return "\n".join(out)


def render_diagnosis_html(d: Diagnosis) -> str:
    e = html.escape
    verdict_colour = "#c62828" if d.finding.located or d.gate_failure is not None else "#2e7d32"
    sections = [f"<h2>{e(d.path)} path (the divergence's)</h2>", _svg(d, d.finding), _html_table(d, d.finding)]
    if d.other is not None:
        sections += [f"<h2>{e(d.other.path)} path</h2>", _svg(d, d.other), _html_table(d, d.other)]
    head = e(_head(d).plain).replace("\n", "<br>")
    ranked = "".join(f"<li>{e(line.split('. ', 1)[1])}</li>" for line in excursion_lines(d))
    if ranked:
        sections.insert(0, f"<h2>largest excursions, both paths</h2><ol>{ranked}</ol>")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>gate diagnose</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1000px}"
        "table{border-collapse:collapse;font-size:12px}td,th{padding:2px 8px;text-align:right}"
        "td.l{text-align:left}tr.first{font-weight:bold;background:#fdecea}</style></head><body>"
        f"<h1>gate diagnose</h1><p style='font-size:1.3em;color:{verdict_colour}'><b>{e(d.summary)}</b></p>"
        f"<p>{head}</p>{''.join(sections)}</body></html>\n"
    )


def _html_table(d: Diagnosis, f: PathFinding) -> str:
    rows = []
    for r in by_layer(f):
        cls = " class='first'" if f.first is not None and r is f.first else ""
        rows.append(
            f"<tr{cls}><td>{r.layer}</td><td class='l'>{html.escape(r.part)}</td>"
            f"<td class='l'>{html.escape(r.module)}</td><td>{_sci(r.error)}</td><td>{_sci(r.honest_band)}</td>"
            f"<td>{html.escape(times(r.ratio))}</td><td>{r.position}</td></tr>"
        )
    return (
        "<details><summary>worst point of each layer</summary><table><tr><th>layer</th><th>part</th>"
        "<th>module</th><th>error</th><th>honest band</th><th>ratio</th><th>at pos</th></tr>"
        + "".join(rows)
        + "</table></details>"
    )
