"""Renderers for `gate calibrate`: pure functions of a `Calibration` (JSON text, rich)."""

from __future__ import annotations

import io

import orjson
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from gate.core.calibration.stats import Calibration, Distribution, Histogram
from gate.text import plural


def render_calibration_json(cal: Calibration) -> str:
    return orjson.dumps(cal.to_dict(), option=orjson.OPT_INDENT_2).decode("utf-8") + "\n"


def _f(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _row(table: Table, label: str, d: Distribution, digits: int = 1) -> None:
    table.add_row(label, str(d.count), _f(d.median, digits), _f(d.p90, digits), _f(d.p99, digits), _f(d.max, digits))


def _histogram(h: Histogram, title: str) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False, box=None)
    table.add_column("mnats", justify="right")
    table.add_column("count", justify="right")
    table.add_column("")
    peak = max(h.counts) if h.counts else 0
    labels = [f"{a:g}-{b:g}" for a, b in zip(h.edges, h.edges[1:], strict=False)] + [f">= {h.edges[-1]:g}"]
    for label, n in zip(labels, h.counts, strict=True):
        bar = "#" * (round(30 * n / peak) if peak else 0)
        table.add_row(label, str(n), bar)
    return table


def calibration_renderable(cal: Calibration) -> RenderableType:
    parts: list[RenderableType] = []
    head = Text()
    head.append("Calibration ", style="bold")
    head.append(
        f"of {cal.candidate_engine or 'candidate'} against {cal.oracle_engine or 'oracle'} "
        f"on {cal.model} ({cal.dtype})\n"
    )
    head.append(
        f"{plural(cal.prompts, 'prompt')}, {plural(cal.positions, 'position')}, {cal.positions_matched} matched "
        "(same context, same token: the common prefix of each free run)"
    )
    parts.append(head)

    drift = Table(title="Drift on matched positions", title_justify="left", show_edge=False)
    drift.add_column("figure (mnats unless said)")
    for col in ("count", "median", "p90", "p99", "max"):
        drift.add_column(col, justify="right")
    _row(drift, "chosen token |Δlogprob|", cal.chosen_abs_delta)
    _row(drift, "shared top-k |Δlogprob|", cal.shared_abs_delta)
    _row(drift, "gap drift: oracle token vs each rival", cal.gap_drift)
    if cal.recommendation.contender_bound_mnats is not None:
        _row(drift, "  of rivals near enough to flip", cal.contender_gap_drift)
    if cal.gap_drift_ulps.count:
        _row(drift, f"gap drift in {cal.dtype} steps", cal.gap_drift_ulps, 2)
    if cal.flip_gaps.count:
        _row(drift, "oracle gap where the candidate flipped", cal.flip_gaps)
    if cal.chosen_logit_abs_delta.count:
        _row(drift, "chosen token |Δlogit|", cal.chosen_logit_abs_delta)
    _row(drift, "KL over shared top-k (renormalised)", cal.kl, 3)
    parts.append(drift)

    top1 = Text()
    if cal.top1_agreement is not None:
        top1.append(
            f"Top-1 agreement: {cal.top1_agreed}/{cal.top1_compared} "
            f"({100 * cal.top1_agreement:.1f}%) positions with the oracle's context "
            f"({cal.top1_source.replace('_', ' ')})\n"
        )
    if cal.shared_support.count:
        top1.append(
            f"Shared top-k support: median {_f(cal.shared_support.median, 0)} tokens, covering a median "
            f"{_f(100 * (cal.shared_mass.median or 0.0))}% of the oracle's probability (KL is over that support, "
            "each side renormalised)"
        )
    parts.append(top1)

    g = cal.top_gaps
    gaps = Text()
    gaps.append("Oracle top-2 gaps: ", style="bold")
    gaps.append(
        f"{plural(g.positions, 'position')}, {plural(g.exact_ties, 'exact tie')}; "
        f"smallest positive {_f(g.smallest_positive_mnats)}, "
        f"p1 {_f(g.p1_mnats)}, p10 {_f(g.p10_mnats)}, median {_f(g.distribution.median)} mnats"
    )
    if g.within_steps is not None:
        steps = ", ".join(f"{n} within {k} step{'s' if k > 1 else ''}" for k, n in g.within_steps.items())
        gaps.append(f"\n  {steps} of the {cal.dtype} grid ({g.positions_with_logits} positions with a raw logit)")
    parts.append(gaps)
    parts.append(_histogram(cal.gap_drift_histogram, "Gap drift histogram"))
    parts.append(_histogram(g.histogram, "Oracle top-2 gap histogram"))

    rec = cal.recommendation
    doc = Text()
    doc.append("Recommended doctrine: ", style="bold")
    doc.append(rec.flags, style="bold green")
    doc.append(f"  (confidence: {rec.confidence})\n")
    for reason in rec.reasons:
        doc.append(f"  - {reason}\n")
    if cal.verdicts is not None:
        v = cal.verdicts
        doc.append(f"Under the default doctrine: {v.default}: {v.default_summary}\n")
        doc.append(f"Under the recommended one: {v.recommended}: {v.recommended_summary}")
        if v.pin is not None:
            doc.append(f"\nUnder the pin's own doctrine (what gate run applies): {v.pin}: {v.pin_summary}")
    for note in cal.notes:
        doc.append(f"\nnote: {note}", style="yellow")
    parts.append(doc)
    if cal.evidence is not None:
        parts.append(_evidence(cal))
    return Group(*parts)


def _evidence(cal: Calibration) -> Text:
    """The evidence rule's quantities and the evidence doctrine they support."""
    ev = cal.evidence
    assert ev is not None
    out = Text()
    out.append("Evidence rule ", style="bold")
    out.append(f"(units: the {cal.dtype} grid step at max(|oracle top logit|, {ev.floor_logit:g})): ")
    out.append(
        f"{ev.measured_flips} of {ev.flips} flips measured; oracle gap max {_f(ev.oracle_gap_units.max, 2)}, "
        f"own margin max {_f(ev.own_margin_units.max, 2)}; "
    )
    if ev.drift.median_ulps is None:
        out.append("drift not measured\n")
    elif not ev.drift.judged:
        out.append(f"drift not judged ({ev.drift.positions} < 16 positions)\n")
    else:
        out.append(f"drift median {_f(ev.drift.median_ulps, 2)} over {ev.drift.positions} positions\n")
    if ev.recommended is not None:
        r = ev.recommended
        out.append("Recommended evidence doctrine: ", style="bold")
        out.append(
            f'"evidence": {{"oracle_ulps": {r.oracle_ulps:g}, "candidate_ulps": {r.candidate_ulps:g}, '
            f'"drift_ulps": {r.drift_ulps:g}, "floor_logit": {r.floor_logit:g}}}',
            style="bold green",
        )
        out.append(f"  (confidence: {ev.confidence}; the pin's oracle.json `doctrine` carries it)\n")
    for reason in ev.reasons:
        out.append(f"  - {reason}\n")
    v = cal.verdicts
    if v is not None and v.evidence is not None:
        out.append(f"Under the pin's doctrine with this evidence rule: {v.evidence}: {v.evidence_summary}")
    return out


def print_calibration(cal: Calibration, console: Console) -> None:
    console.print(calibration_renderable(cal))


def render_calibration_text(cal: Calibration, width: int = 110) -> str:
    """The rich report as plain text (no colour), for files and tests."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, highlight=False, soft_wrap=False)
    console.print(calibration_renderable(cal))
    return buf.getvalue()
