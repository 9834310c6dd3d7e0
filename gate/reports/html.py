"""Visual report: one self-contained HTML page (inline CSS, JS and SVG; nothing fetched).

The page shows the summary and verdict, a strip per prompt with each position coloured by
its outcome (match, exact tie, near tie, defect, unadjudicated: `PromptResult.outcomes`),
the gap distribution of the divergences, any figures the caller hands over in
`result.meta["figures"]`, and every divergence laid out for adjudication.

Figures hook (for calibration and drift plots): `result.meta["figures"]` is a list of
`Figure` dicts; each is drawn as a histogram:

    {"title": "Drift of the chosen token's logprob", "unit": "mnats",
     "values": [...],                          # raw samples, binned here (1-2-5 steps), or
     "edges": [0, 10, 20, ...], "counts": [...],   # pre-binned: len(edges) == len(counts) + 1
     "markers": [{"at": 125.0, "label": "near-tie threshold"}],
     "note": "one line under the plot"}

A figure that does not fit this shape is skipped with a visible note, never an exception.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from itertools import groupby
from typing import Any, TypedDict

from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.result import (
    DEFECT,
    EXACT_TIE,
    NEAR_TIE,
    OUTCOME_DEFECT,
    OUTCOME_EXACT_TIE,
    OUTCOME_MATCH,
    OUTCOME_NAMES,
    OUTCOME_NEAR_TIE,
    OUTCOME_UNADJUDICATED,
    Divergence,
    GateResult,
    PromptResult,
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
from gate.reports.distribution import distribution_detail_lines, distribution_html, floor_provenance
from gate.reports.reason import because, headline
from gate.version import __version__

# Full cards for the first divergences; one table row for each of the rest.
MAX_CARDS = 60
OUTCOME_CSS = {
    OUTCOME_MATCH: "o-match",
    OUTCOME_EXACT_TIE: "o-exact",
    OUTCOME_NEAR_TIE: "o-near",
    OUTCOME_DEFECT: "o-defect",
    OUTCOME_UNADJUDICATED: "o-unadj",
}
CLASS_CSS = {EXACT_TIE: "o-exact", NEAR_TIE: "o-near", DEFECT: "o-defect"}


class Marker(TypedDict, total=False):
    at: float
    label: str


class Figure(TypedDict, total=False):
    title: str
    unit: str
    values: Sequence[float]
    edges: Sequence[float]
    counts: Sequence[int]
    markers: Sequence[Marker]
    note: str


@dataclass(frozen=True, slots=True)
class Bar:
    label: str
    count: int
    css: str = "bar"
    hi: float | None = None  # upper edge, where a marker can sit


def render_html(result: GateResult) -> str:
    """The page, composed by concatenation of escaped parts: no text from the result is
    ever a template, so a model id such as `{body}` is shown, never expanded."""
    result = for_humans(result)
    title = f"gate: {headline(result)}" + (f" — {result.model}" if result.model else "")
    body = "\n".join(
        [
            _header(result),
            _notices(result),
            _divergences(result),
            _distribution_section(result),
            _strips(result),
            _plots(result),
            _details(result),
            f"<footer>gate {escape(__version__)} · self-contained report, nothing loaded from the network</footer>",
        ]
    )
    return "".join(
        [
            _PAGE_HEAD,
            "<title>",
            escape(title),
            "</title>\n<style>",
            _CSS,
            "</style>\n</head>\n<body>\n",
            body,
            "\n<script>",
            _JS,
            "</script>\n</body>\n</html>\n",
        ]
    )


# --------------------------------------------------------------------------- summary


def _header(result: GateResult) -> str:
    """The verdict card: the verdict, its reason in one sentence, the counts; nothing else."""
    c = result.counts
    counts = [
        ("prompts strict", f"{c['strict_pass']}/{c['prompts']}", ""),
        ("prompts ratified", f"{c['ratified_pass']}/{c['prompts']}", ""),
        ("positions matched", f"{c['positions_matched']}/{c['positions']}", ""),
        ("exact ties", str(c["exact_ties"]), "o-exact"),
        ("near ties", str(c["near_ties"]), "o-near"),
        ("defects", str(c["defects"]), "o-defect"),
        ("unadjudicated", str(c["unadjudicated_positions"]), "o-unadj"),
    ]
    chips = "".join(
        f'<div class="tally"><span class="swatch {css}"></span><b>{escape(v)}</b> <small>{escape(k)}</small></div>'
        for k, v, css in counts
    )
    return (
        f'<header class="verdict v-{escape(result.verdict)}" id="verdict">'
        f"<h1>{escape(headline(result))}</h1>"
        f'<p class="reason" id="reason">{escape(because(result))}</p>'
        f'<p class="summary" id="summary">{escape(result.summary)} · exit {result.exit_code}</p>'
        f'<div class="tallies">{chips}</div></header>'
    )


def _notices(result: GateResult) -> str:
    """What the reader must see before the figures: warnings, a sampler that is not greedy,
    a run drifting beyond the doctrine."""
    parts = [f'<p class="warn">warning: {escape(w)}</p>' for w in result.warnings]
    if result.not_greedy_total:
        parts.append(f'<p class="alarm">{escape(not_greedy_line(result) or "")}</p>')
    if result.drift is not None and result.drift.beyond:
        parts.append(f'<p class="alarm">{escape(drift_line(result) or "")}</p>')
    return f'<section id="notices">{"".join(parts)}</section>' if parts else ""


def _distribution_section(result: GateResult) -> str:
    block = distribution_html(result)
    if not block:
        return ""
    return f'<section id="distribution"><h2>Distribution against the oracle</h2>{block}</section>'


def _details(result: GateResult) -> str:
    """Provenance and the long explanations, folded."""
    lines = [provenance_line(result), doctrine_line(result), drift_line(result) or "", verdict_line(result)]
    d = result.distribution
    if d is not None and d.overall.positions:
        lines += [distribution_detail_lines(result)[0][0], floor_provenance(d)]
    body = "".join(f"<p>{escape(line)}</p>" for line in lines if line)
    return (
        '<details id="details"><summary>Details: provenance, doctrine, drift, the distribution\'s floor</summary>'
        f"{body}</details>"
    )


# --------------------------------------------------------------------------- strips


def _legend() -> str:
    return (
        '<div class="legend">'
        + "".join(
            f'<span><i class="swatch {OUTCOME_CSS[code]}"></i>{escape(name)}</span>'
            for code, name in OUTCOME_NAMES.items()
        )
        + "</div>"
    )


def _strips(result: GateResult) -> str:
    width = max((p.positions for p in result.prompts), default=1) or 1
    groups = by_prompt(result)
    rows = [_strip(p, groups.get(p.id, []), width) for p in result.prompts]
    diverged = sum(1 for p in result.prompts if not p.strict)
    return (
        '<section id="strips"><h2>Positions</h2>'
        f"<p>One strip per prompt, one cell per position of the oracle's continuation "
        f"({width} at most). Click a coloured cell for its divergence.</p>"
        + _legend()
        + '<label class="filter"><input type="checkbox" id="only-diverged"> only the '
        + f"{diverged} prompt{'s' if diverged != 1 else ''} that diverged</label>"
        + '<div class="strips">'
        + "".join(rows)
        + "</div></section>"
    )


def _strip(p: PromptResult, divs: list[Divergence], width: int) -> str:
    outcomes = p.outcomes or (OUTCOME_MATCH * p.positions if p.strict else "")
    rects = []
    pos = 0
    for code, run in groupby(outcomes):
        n = sum(1 for _ in run)
        css = OUTCOME_CSS.get(code, "o-unadj")
        label = (
            f"{OUTCOME_NAMES.get(code, code)}: positions {pos}–{pos + n - 1}"
            if n > 1
            else f"{OUTCOME_NAMES.get(code, code)}: position {pos}"
        )
        if code in (OUTCOME_EXACT_TIE, OUTCOME_NEAR_TIE, OUTCOME_DEFECT):
            # one link per divergence; a stroke keeps a single position visible however long the strip
            for i in range(pos, pos + n):
                rects.append(
                    f'<a href="#{_anchor(p.id, i)}"><rect x="{i}" y="0" width="1" height="1" class="{css} div">'
                    f"<title>{escape(p.id)} position {i}: {escape(OUTCOME_NAMES[code])}</title></rect></a>"
                )
        else:
            rects.append(
                f'<rect x="{pos}" y="0" width="{n}" height="1" class="{css}"><title>{escape(label)}</title></rect>'
            )
        pos += n
    note = class_counts(divs)
    status = "strict" if p.strict else ("ratified" if p.ratified else "failed")
    return (
        f'<div class="strip s-{status}" data-strict="{int(p.strict)}">'
        f'<span class="pid" title="{escape(p.id)}">{escape(p.id)}</span>'
        f'<svg class="cells" viewBox="0 0 {width} 1" preserveAspectRatio="none" role="img" '
        f'aria-label="{escape(p.id)}: {escape(status)}">{"".join(rects)}</svg>'
        f'<span class="count">{p.positions_matched}/{p.positions}'
        + (f" · {escape(note)}" if note else "")
        + "</span></div>"
    )


def _anchor(prompt_id: str, position: int) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_" else f"_{ord(ch):x}" for ch in prompt_id)
    return f"d-{safe}-{position}"


# --------------------------------------------------------------------------- plots


def _edges_125(lo: float, hi: float) -> list[float]:
    """Bin edges in 1-2-5 steps: the last step below `lo` to the first at or above `hi`."""
    steps = [
        float(f"{m}e{e}")  # exact decimal values: 0.2, not 2 * 0.1
        for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 2)
        for m in (1, 2, 5)
    ]
    start = max(i for i, v in enumerate(steps) if v < lo)
    end = min(i for i, v in enumerate(steps) if v >= hi)
    return steps[start : end + 1]


def bars_from_values(values: Sequence[float], markers: Sequence[float] = ()) -> list[Bar]:
    """Histogram bars: one for exact zeros, then 1-2-5 bins, (lo, hi]. Each positive marker
    becomes a bin edge, so a value equal to it (a gap at the threshold) lands on its left."""
    vals = [abs(float(v)) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    zeros = sum(1 for v in vals if v == 0.0)
    pos = [v for v in vals if v != 0.0]
    bars: list[Bar] = []
    if zeros:
        bars.append(Bar("0", zeros, "bar", 0.0))
    if not pos:
        return bars
    marks = [float(m) for m in markers if m > 0.0 and math.isfinite(m)]
    edges = _edges_125(min([*pos, *marks]), max([*pos, *marks]))
    edges = sorted({*edges, *marks})
    counts = [0] * (len(edges) - 1)
    for v in pos:
        counts[bisect_left(edges, v, 1, len(edges) - 1) - 1] += 1
    keep = [i for i, n in enumerate(counts) if n] + [i for i in range(len(counts)) if edges[i + 1] in marks]
    for i in range(min(keep), max(keep) + 1):
        bars.append(Bar(f"{_num(edges[i])}–{_num(edges[i + 1])}", counts[i], "bar", edges[i + 1]))
    return bars


def _num(x: float) -> str:
    return f"{x:g}" if abs(x) < 1e6 else f"{x:.0e}"


def gap_axis(result: GateResult) -> tuple[str, float, str, str]:
    """The axis the gap histogram uses: the doctrine's own (`gap_units` against the evidence
    rule's oracle limit, `gap_ulps` against near_tie_ulps, else mnats against near_tie_mnats),
    as (Divergence attribute, threshold, unit label, marker label)."""
    d = result.doctrine
    in_top = [x for x in result.divergences if x.oracle_minus_candidate_mnats is not None]
    if d.evidence is not None and in_top and all(x.gap_units is not None for x in in_top):
        unit = f"evidence units (the {d.dtype or 'bfloat16'} grid step at max(|top logit|, {d.evidence.floor_logit:g}))"
        return "gap_units", float(d.evidence.oracle_ulps), unit, f"evidence: oracle gap ≤ {d.evidence.oracle_ulps:g}"
    if d.near_tie_ulps is not None and in_top and all(x.gap_ulps is not None for x in in_top):
        unit = f"grid steps of the top logit's own {d.dtype or 'bfloat16'} grid"
        return "gap_ulps", float(d.near_tie_ulps), unit, f"grid rule ≤ {d.near_tie_ulps:g}"
    threshold = float(d.near_tie_mnats)
    return "oracle_minus_candidate_mnats", threshold, "mnats", f"near-tie threshold {fmt_mnats(threshold)}"


_CLASS_BAR = CLASS_CSS


def _gap_bars(result: GateResult) -> list[Bar]:
    """One bar per bin and class (blue exact ties, amber near ties, red defects): the colour
    is the verdict's class of those divergences, never a guess from the gap."""
    attr, threshold, _, _ = gap_axis(result)
    divs = result.divergences
    in_top = [(float(getattr(d, attr)), d.cls) for d in divs if d.oracle_minus_candidate_mnats is not None]
    bars: list[Bar] = []
    zeros = Counter(cls for v, cls in in_top if v == 0.0)
    for cls in (EXACT_TIE, NEAR_TIE, DEFECT):
        if zeros.get(cls):
            bars.append(Bar("0 (exact tie)" if cls == EXACT_TIE else "0", zeros[cls], _CLASS_BAR[cls], 0.0))
    pos = [(abs(v), cls) for v, cls in in_top if v != 0.0 and math.isfinite(v)]
    if pos:
        marks = [threshold] if threshold > 0 else []
        edges = sorted({*_edges_125(min([v for v, _ in pos] + marks), max([v for v, _ in pos] + marks)), *marks})
        counts: Counter[tuple[int, str]] = Counter(
            (bisect_left(edges, v, 1, len(edges) - 1) - 1, cls) for v, cls in pos
        )
        used = [i for i, _ in counts] + [i for i in range(len(edges) - 1) if edges[i + 1] in marks]
        for i in range(min(used), max(used) + 1):
            label = f"{_num(edges[i])}–{_num(edges[i + 1])}"
            present = [cls for cls in (EXACT_TIE, NEAR_TIE, DEFECT) if counts.get((i, cls))]
            for cls in present or [NEAR_TIE]:
                bars.append(Bar(label, counts.get((i, cls), 0), _CLASS_BAR[cls] if present else "bar", edges[i + 1]))
    outside = sum(1 for d in divs if d.candidate_token is not None and d.oracle_minus_candidate_mnats is None)
    stopped = sum(1 for d in divs if d.candidate_token is None)
    if outside:
        bars.append(Bar("not in top-k", outside, "o-defect"))
    if stopped:
        bars.append(Bar("stopped early", stopped, "o-defect"))
    return bars


def svg_histogram(bars: Sequence[Bar], *, title: str, unit: str, markers: Sequence[tuple[float, str]] = ()) -> str:
    """A bar chart as inline SVG: counts above the bars, bin labels below, markers dashed."""
    bw, gap, left, top, plot_h, bottom = 64, 10, 40, 44, 150, 56
    plot_w = len(bars) * (bw + gap)
    longest_marker = max((len(label) for _, label in markers), default=0)
    # wide enough for the title, and for a marker's label beside the last bar
    width = left + max(plot_w + 20, 8 * len(title), plot_w + 7 * longest_marker)
    height = top + plot_h + bottom
    peak = max((b.count for b in bars), default=0) or 1
    parts = [
        f'<svg class="hist" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}">',
        f'<text x="{left}" y="16" class="t">{escape(title)}</text>',
        f'<line x1="{left - 4}" y1="{top + plot_h}" x2="{width - 10}" y2="{top + plot_h}" class="axis"/>',
    ]
    for i, b in enumerate(bars):
        x = left + i * (bw + gap)
        h = round(plot_h * b.count / peak) if b.count else 0
        y = top + plot_h - h
        parts.append(
            f'<rect x="{x}" y="{y}" width="{bw}" height="{max(h, 1 if b.count else 0)}" class="{escape(b.css)}">'
            f"<title>{escape(b.label)} {escape(unit)}: {b.count}</title></rect>"
            f'<text x="{x + bw / 2}" y="{y - 4}" class="n">{b.count}</text>'
            f'<text x="{x + bw / 2}" y="{top + plot_h + 16}" class="l">{escape(b.label)}</text>'
        )
    for at, label in markers:
        # the marker sits on the right edge of the bin whose upper edge it is, else is left out
        idx = max((i for i, b in enumerate(bars) if b.hi is not None and b.hi == at), default=None)
        if idx is None:
            continue
        mx = left + idx * (bw + gap) + bw + gap / 2
        parts.append(
            f'<line x1="{mx}" y1="{top - 20}" x2="{mx}" y2="{top + plot_h}" class="marker"/>'
            f'<text x="{mx + 3}" y="{top - 12}" class="m">{escape(label)}</text>'
        )
    parts.append(f'<text x="{left}" y="{height - 8}" class="u">{escape(unit)}</text></svg>')
    return "".join(parts)


def _figure(fig: Any, index: int) -> str:
    if not isinstance(fig, dict):
        return f'<p class="note">figure {index} skipped: not an object</p>'
    title = str(fig.get("title", f"figure {index}"))
    unit = str(fig.get("unit", ""))
    raw_markers = fig.get("markers") or []
    markers: list[tuple[float, str]] = []
    for m in raw_markers if isinstance(raw_markers, list) else []:
        if isinstance(m, dict) and isinstance(m.get("at"), (int, float)):
            markers.append((float(m["at"]), str(m.get("label", ""))))
    if isinstance(fig.get("values"), (list, tuple)):
        bars = bars_from_values(fig["values"], [at for at, _ in markers])
    elif isinstance(fig.get("edges"), (list, tuple)) and isinstance(fig.get("counts"), (list, tuple)):
        edges, counts = list(fig["edges"]), list(fig["counts"])
        if len(edges) != len(counts) + 1 or not all(isinstance(v, (int, float)) for v in [*edges, *counts]):
            return f'<p class="note">figure {escape(title)} skipped: edges must be one longer than counts</p>'
        bars = [
            Bar(f"{_num(edges[i])}–{_num(edges[i + 1])}", int(counts[i]), "bar", float(edges[i + 1]))
            for i in range(len(counts))
        ]
    else:
        return f'<p class="note">figure {escape(title)} skipped: it needs values, or edges and counts</p>'
    if not bars:
        return f'<p class="note">{escape(title)}: no data</p>'
    note = f'<p class="note">{escape(str(fig["note"]))}</p>' if fig.get("note") else ""
    return f"<figure>{svg_histogram(bars, title=title, unit=unit, markers=markers)}{note}</figure>"


def _plots(result: GateResult) -> str:
    parts = ['<section id="plots"><h2>Gaps and figures</h2><div class="figs">']
    bars = _gap_bars(result)
    _, threshold, unit, marker = gap_axis(result)
    if bars:
        parts.append(
            "<figure>"
            + svg_histogram(
                bars,
                title="Gap of each divergence: oracle − candidate logprob",
                unit=unit,
                markers=[(threshold, marker)],
            )
            + '<p class="note">Coloured by the class the verdict gave: blue exact ties (a gap of 0.0), amber '
            "near ties, red defects (a defect inside the line failed another limit: its card names it).</p></figure>"
        )
    else:
        parts.append('<p class="note">No divergences: no gaps to plot.</p>')
    figures = result.meta.get("figures") if isinstance(result.meta, dict) else None
    if isinstance(figures, list):
        parts.extend(_figure(fig, i) for i, fig in enumerate(figures, start=1))
    parts.append("</div></section>")
    return "".join(parts)


# --------------------------------------------------------------------------- divergences


def _row(label: str, value: str, css: str = "") -> str:
    return f'<tr><th>{escape(label)}</th><td class="{css}">{value}</td></tr>'


def _card(d: Divergence, prompt: str | None, near: Doctrine | float) -> str:
    css = CLASS_CSS.get(d.cls, "")
    rows = []
    if prompt is not None:
        rows.append(_row("prompt", f'<span class="prompt">{escape(quote(prompt))}</span>'))
    rows.append(
        _row(
            "oracle",
            f"<b>{escape(token_label(d.oracle_token, d.oracle_text))}</b> "
            f"logprob <code>{escape(fmt_logprob(d.oracle_logprob))}</code>",
        )
    )
    cand = f"<b>{escape(token_label(d.candidate_token, d.candidate_text))}</b>"
    if d.candidate_logprob is not None:
        cand += f" logprob <code>{escape(fmt_logprob(d.candidate_logprob))}</code>"
        if d.cls == EXACT_TIE:
            cand += ' <span class="badge o-exact">= bit for bit</span>'
    if d.candidate_rank is not None:
        cand += f" · rank {d.candidate_rank} in the oracle's top-k"
    elif d.candidate_token is not None:
        cand += " · not in the oracle's top-k"
    rows.append(_row("candidate", cand))
    gaps = f"oracle − candidate <b>{escape(gap_label(d))}</b> mnats"
    if d.gap_ulps is not None:
        gaps += f" ({escape(fmt_ulps(d.gap_ulps))} grid steps)"
    gaps += f" · top-2 gap {escape(fmt_mnats(d.top2_gap_mnats))} mnats"
    rows.append(_row("gaps", gaps))
    rows.append(
        _row(
            "class",
            escape(why(d, near, with_rule=False)) + (" — fails the prompt" if d.cls == DEFECT else " — ratified"),
        )
    )
    if d.tie_break is not None:
        rows.append(_row("tie-break", escape(tie_break_line(d))))
    if d.alternatives:
        top_lp = d.alternatives[0][1]
        alt_rows = "".join(
            f'<tr class="{"is-o" if t == d.oracle_token else "is-c " + css if t == d.candidate_token else ""}">'
            f"<td>{r}</td><td>{escape(token_label(t, txt))}</td><td><code>{escape(fmt_logprob(lp))}</code></td>"
            f"<td>{escape(fmt_mnats(1000.0 * (top_lp - lp)))}</td>"
            f"<td>{'oracle' if t == d.oracle_token else 'candidate' if t == d.candidate_token else ''}</td></tr>"
            for r, (t, lp, txt) in enumerate(d.alternatives, start=1)
        )
        rows.append(
            _row(
                "oracle top",
                '<table class="alts"><tr><th>#</th><th>token</th><th>logprob</th>'
                f"<th>below top (mnats)</th><th></th></tr>{alt_rows}</table>",
            )
        )
    return (
        f'<article class="div {css}" id="{_anchor(d.prompt_id, d.position)}">'
        f'<h3><span class="badge {css}">{escape(CLASS_LABELS.get(d.cls, d.cls))}</span> '
        f"{escape(d.prompt_id)} · position {d.position} · {escape(source_label(d))}</h3>"
        f'<table class="kv">{"".join(rows)}</table></article>'
    )


def _divergences(result: GateResult) -> str:
    divs = list(result.divergences)
    if not divs:
        return '<section id="divergences"><h2>Divergences</h2><p>None: every prompt is strict.</p></section>'
    prompts = {p.id: p.prompt for p in result.prompts}
    near = result.doctrine
    parts = [f'<section id="divergences"><h2>Divergences ({len(divs)})</h2>']
    parts.extend(_card(d, prompts.get(d.prompt_id), near) for d in divs[:MAX_CARDS])
    rest = divs[MAX_CARDS:]
    if rest:
        head = "".join(
            f"<th>{h}</th>"
            for h in (
                "prompt",
                "position",
                "source",
                "class",
                "oracle",
                "candidate",
                "oracle − candidate (mnats)",
                "top-2 gap",
                "rank",
                "tie-break",
            )
        )
        body = "".join(
            f'<tr id="{_anchor(d.prompt_id, d.position)}"><td>{escape(d.prompt_id)}</td><td>{d.position}</td>'
            f"<td>{escape(source_label(d))}</td>"
            f'<td><span class="badge {CLASS_CSS.get(d.cls, "")}">{escape(CLASS_LABELS.get(d.cls, d.cls))}</span></td>'
            f"<td>{escape(token_label(d.oracle_token, d.oracle_text))}</td>"
            f"<td>{escape(token_label(d.candidate_token, d.candidate_text))}</td><td>{escape(gap_label(d))}</td>"
            f"<td>{escape(fmt_mnats(d.top2_gap_mnats))}</td><td>{d.candidate_rank or '—'}</td>"
            f"<td>{escape(d.tie_break or '—')}</td></tr>"
            for d in rest
        )
        parts.append(f'<h3>The other {len(rest)}</h3><table class="rest"><tr>{head}</tr>{body}</table>')
    parts.append("</section>")
    return "".join(parts)


_CSS = """
:root{--match:#b7e1c1;--exact:#1f6fd1;--near:#f0a500;--defect:#d7263d;--unadj:#d4d4d4;--ink:#1d2433;--mute:#5f6b7a}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--ink);margin:0 auto;
  max-width:1200px;padding:16px 24px;background:#fafbfc}
h1{margin:0;font-size:26px}h2{margin:28px 0 8px;font-size:19px}h3{margin:0 0 8px;font-size:15px}
code{font:12.5px ui-monospace,SFMono-Regular,Menlo,monospace}
.verdict{padding:16px 20px;border-radius:8px;color:#fff;overflow-wrap:anywhere}
.v-strict_pass{background:#14663a}.v-ratified_pass{background:#1b5cae}.v-fail{background:#a61b1b}
.verdict h1{font-size:30px;letter-spacing:.02em}
.verdict .reason{margin:8px 0 6px;font-size:17px;font-weight:600;line-height:1.4}
.verdict .summary{margin:0 0 10px;font:14px ui-monospace,Menlo,monospace}
.tallies{display:flex;flex-wrap:wrap;gap:8px}
.tally{background:#fff;color:var(--ink);border-radius:6px;padding:4px 10px}
.tally b{font-size:17px}.tally small{color:#3f4a5a;font-size:13px}
.warn{background:#fff4d6;border:1px solid #e0b84a;color:#4a3700;border-radius:6px;padding:8px 12px}
.alarm{background:#fde8e8;border:1px solid #d7263d;color:#6b0f0f;border-radius:6px;padding:8px 12px;font-weight:600}
#distribution .dverdict{font-weight:700;font-size:15px}
#distribution .loud{color:#a61b1b}
#distribution pre{background:#fff;border:1px solid #e1e4e8;border-radius:6px;padding:8px 12px;overflow-x:auto;
  font:12.5px ui-monospace,Menlo,monospace;color:var(--ink)}
details#details{margin:24px 0;background:#fff;border:1px solid #e1e4e8;border-radius:6px;padding:8px 12px}
details#details summary{cursor:pointer;font-weight:600}
details#details p{color:#3f4a5a;font-size:13px;overflow-wrap:anywhere}
.swatch{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:6px;vertical-align:-1px}
.tally .swatch:not([class*="o-"]){display:none}
.o-match{fill:var(--match);background:var(--match)}.o-exact{fill:var(--exact);background:var(--exact);stroke:var(--exact)}
.o-near{fill:var(--near);background:var(--near);stroke:var(--near)}
.o-defect{fill:var(--defect);background:var(--defect);stroke:var(--defect)}
.o-unadj{fill:var(--unadj);background:var(--unadj)}
.legend{display:flex;gap:16px;margin:6px 0}.legend i{display:inline-block;width:14px;height:14px;
  border-radius:2px;margin-right:5px;vertical-align:-2px}
.filter{display:block;margin:6px 0 10px;color:var(--mute)}
.strips{background:#fff;border:1px solid #e1e4e8;border-radius:6px;padding:8px 10px}
.strip{display:grid;grid-template-columns:120px 1fr 220px;align-items:center;gap:10px;height:20px}
.pid{font:12px ui-monospace,Menlo,monospace;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.cells{width:100%;height:14px;display:block;background:#f3f4f6}
.cells rect.div{stroke-width:3px;vector-effect:non-scaling-stroke}
.count{font-size:12px;color:var(--mute);white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.s-failed .pid{color:var(--defect);font-weight:700}
body.only-diverged .strip[data-strict="1"]{display:none}
.figs{display:flex;flex-wrap:wrap;gap:18px}figure{margin:0;background:#fff;border:1px solid #e1e4e8;
  border-radius:6px;padding:8px}
.hist .t{font-weight:600;font-size:13px}.hist .n{font-size:11px;text-anchor:middle}
.hist .l{font-size:10px;text-anchor:middle;fill:var(--mute)}.hist .u{font-size:11px;fill:var(--mute)}
.hist .axis{stroke:#999}.hist .marker{stroke:#333;stroke-dasharray:4 3}.hist .m{font-size:10px}
.hist rect.bar{fill:#7a8ca3}.hist rect{stroke:none}
.note{color:var(--mute);font-size:12px;margin:4px 0}
article.div{background:#fff;border:1px solid #e1e4e8;border-left:6px solid;border-radius:6px;padding:10px 14px;
  margin:10px 0;scroll-margin-top:12px}
article.o-exact{border-left-color:var(--exact)}article.o-near{border-left-color:var(--near)}
article.o-defect{border-left-color:var(--defect)}article:target{box-shadow:0 0 0 3px #ffd54a}
.badge{display:inline-block;color:#fff;border-radius:4px;padding:0 7px;font-size:12px;font-weight:700;
  text-transform:uppercase;letter-spacing:.03em}
.kv th{text-align:left;color:var(--mute);font-weight:500;padding:2px 14px 2px 0;vertical-align:top;white-space:nowrap}
.kv td{padding:2px 0}.prompt{white-space:pre-wrap;font:12.5px ui-monospace,Menlo,monospace}
.alts{border-collapse:collapse;margin-top:2px}.alts td,.alts th{padding:1px 10px 1px 0;font-size:12.5px;text-align:left}
.alts .is-o{font-weight:700}.alts .is-c td{color:#fff}
.alts .is-c.o-near td,.badge.o-near{color:var(--ink)}
.rest{border-collapse:collapse;background:#fff;width:100%}.rest td,.rest th{border-bottom:1px solid #eee;
  padding:3px 8px;text-align:left;font-size:12.5px}
footer{margin:30px 0 10px;color:var(--mute);font-size:12px}
"""

_JS = """
(function () {
  var box = document.getElementById("only-diverged");
  if (box) {
    box.addEventListener("change", function () {
      document.body.classList.toggle("only-diverged", box.checked);
    });
  }
  document.documentElement.setAttribute("data-gate-ready", "1");
})();
"""

_PAGE_HEAD = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; \
script-src 'unsafe-inline'; img-src data:">
"""
