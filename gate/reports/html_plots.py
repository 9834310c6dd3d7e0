"""The HTML report's plots (`html.py`'s "Gaps and figures" section): the gap of every
divergence, and any figure the caller hands over in `result.meta["figures"]`, each an
inline SVG histogram (binned here in 1-2-5 steps when given raw values)."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any, TypedDict

from gate.core.verdict.result import DEFECT, EXACT_TIE, NEAR_TIE, GateResult
from gate.reports._common import fmt_mnats
from gate.reports.html_style import CLASS_CSS


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


def plots_section(result: GateResult) -> str:
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
