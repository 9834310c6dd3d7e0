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

from html import escape
from itertools import groupby

from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.result import (
    DEFECT,
    EXACT_TIE,
    OUTCOME_DEFECT,
    OUTCOME_EXACT_TIE,
    OUTCOME_MATCH,
    OUTCOME_NAMES,
    OUTCOME_NEAR_TIE,
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
from gate.reports.html_plots import plots_section
from gate.reports.html_style import CLASS_CSS, CSS, JS, MAX_CARDS, OUTCOME_CSS, PAGE_HEAD
from gate.reports.reason import because, headline
from gate.version import __version__


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
            plots_section(result),
            _details(result),
            f"<footer>gate {escape(__version__)} · self-contained report, nothing loaded from the network</footer>",
        ]
    )
    return "".join(
        [
            PAGE_HEAD,
            "<title>",
            escape(title),
            "</title>\n<style>",
            CSS,
            "</style>\n</head>\n<body>\n",
            body,
            "\n<script>",
            JS,
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
