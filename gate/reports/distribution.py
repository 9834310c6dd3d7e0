"""The distribution block of a gate report: llama.cpp's `--kl-divergence` figures, by class,
and the verdict against the pin's honest floor (`gate.core.verdict.distribution`).

Every renderer calls one function here: `distribution_lines` (plain lines with a style
name each, for the terminal, Markdown, HTML and JUnit reports). The JSON report carries
`GateResult.distribution.to_dict()` as `distribution`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gate.core.verdict.distribution import (
    BEYOND_WHY,
    MIN_POSITIONS,
    NOT_JUDGED_WHY,
    RULE_NOT_JUDGED,
    Figures,
    RunDistribution,
)
from gate.core.verdict.free_forced import FREE_FORCED_WHY, RULE_FREE_FORCED
from gate.core.verdict.result import GateResult
from gate.reports.reason import no_floor_words

CLASS_WORDS = {"match": "match", "exact_tie": "exact tie", "near_tie": "near tie", "defect": "defect"}
LOUD, QUIET, PLAIN = "loud", "quiet", "plain"


def _n(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _pm(mean: float | None, se: float | None, digits: int = 3) -> str:
    return _n(mean, digits) + (f" ± {se:.{digits}f}" if se is not None else "")


def figure_lines(f: Figures) -> list[str]:
    """The llama.cpp block of one set of positions."""
    rate = None if f.same_top_rate is None else 100.0 * f.same_top_rate
    se = None if f.same_top_se is None else 100.0 * f.same_top_se
    return [
        f"  Mean    KLD: {_pm(f.kl_mean_mnats, f.kl_se_mnats)} mnats",
        f"  Maximum KLD: {_n(f.kl_max_mnats)} mnats",
        f"  99.0%   KLD: {_n(f.kl_p99_mnats)} mnats",
        f"  Median  KLD: {_n(f.kl_median_mnats)} mnats",
        f"  Mean    Δp: {_pm(f.dp_mean_pct, f.dp_se_pct)} %",
        f"  Maximum Δp: {_n(f.dp_max_pct)} %   Median Δp: {_n(f.dp_median_pct)} %   "
        f"Minimum Δp: {_n(f.dp_min_pct)} %   RMS Δp: {_n(f.dp_rms_pct)} %",
        f"  Same top p: {_pm(rate, se, 2)} %",
    ]


def class_line(d: RunDistribution) -> str:
    parts = [
        f"{CLASS_WORDS.get(name, name)} {f.positions} (KL mean {_n(f.kl_mean_mnats, 2)}, "
        f"same top {_n(None if f.same_top_rate is None else 100 * f.same_top_rate, 1)}%)"
        for name, f in d.by_class
    ]
    return "  by class: " + "; ".join(parts)


def limits_text(d: RunDistribution) -> str:
    fl = d.deciding_floor
    if fl is None:
        return ""
    if d.by_reference:
        base = d.reference_baseline or 0.0
        mean = f"vs the float32 reference: mean KL ≤ the oracle's own {base:.3f} + {fl.kl_mean_limit:.3f} mnats"
    else:
        mean = f"mean KL ≤ {fl.kl_mean_limit:.3f} mnats"
    return f"{mean}, p99 KL ≤ {fl.kl_p99_limit:.3f} mnats, same top ≥ {100 * (1 - fl.same_top_miss_limit):.2f}%"


def against_words(d: RunDistribution) -> str:
    """What the verdict measured the candidate against, true of the pin."""
    if d.by_reference:
        return (
            "judged against the pin's float32 reference (the same weights in float32 along the oracle's tokens), "
            "so only the candidate's own rounding sits in its figures"
        )
    if d.deciding_floor is None:
        return ""
    if d.reference is not None:
        return "judged against the oracle's bf16 lists: the pin carries float32 reference lists but no floor for them"
    return "judged against the oracle's bf16 lists: this pin carries no float32 reference (gate pin reference adds one)"


def floor_provenance(d: RunDistribution) -> str:
    """Where the floor's limits come from (the long part: the details section's)."""
    fl = d.deciding_floor
    if fl is None:
        return ""
    ratio = f"; the run's ratio (largest figure over its limit) {d.ratio:.2f}" if d.ratio is not None else ""
    return (
        f"the honest floor ({against_words(d)}): its limits are the floor × margin {fl.margin:g}; "
        f"{fl.measured_by}{ratio}"
    )


def floor_line(d: RunDistribution, result: GateResult | None = None) -> tuple[str, str]:
    """What the distribution verdict decided, in one line, and how loud to say it. With the
    result, the line says whether a missing floor is the pin's or a trace oracle's."""
    if d.deciding_floor is None:
        said = no_floor_words(result) if result is not None else "no honest floor was given"
        return (f"distribution verdict: none — {said}, so this run is judged without it", PLAIN)
    limits = limits_text(d)
    own = not_judged_words(d)
    if d.insufficient:
        beyond = f" (figures beyond the floor as measured: {'; '.join(d.beyond_figures)})" if d.beyond_figures else ""
        return (
            f"distribution verdict: NOT JUDGED — {NOT_JUDGED_WHY}: {d.not_judged_reason}{beyond}. "
            f"Not a pass (exit 1, rule {RULE_NOT_JUDGED})",
            LOUD,
        )
    if not d.judged:
        return (f"distribution verdict: not judged — {own} (limits: {limits})", PLAIN)
    if d.beyond:
        also = (
            f"; and {'; '.join(d.free_forced.beyond_figures)} (rule {RULE_FREE_FORCED})"
            if d.disagrees and d.free_forced is not None
            else ""
        )
        return (
            f"distribution verdict: BEYOND THE HONEST FLOOR — {'; '.join(d.beyond_figures)}: {BEYOND_WHY}{also}. "
            "Not a pass (exit 1), whatever the token flips say",
            LOUD,
        )
    if d.disagrees and d.free_forced is not None:
        return (
            f"distribution verdict: FREE RUN AND FORCED DECODE DISAGREE — {'; '.join(d.free_forced.beyond_figures)}: "
            f"{FREE_FORCED_WHY}. Not a pass (exit 1, rule {RULE_FREE_FORCED})",
            LOUD,
        )
    ratio = f"; ratio {d.ratio:.2f}" if d.ratio is not None else ""
    return (f"distribution verdict: within the honest floor ({limits}{ratio})", QUIET)


def not_judged_words(d: RunDistribution) -> str:
    """Why a run with a floor is not judged, in the core's own words."""
    return d.not_judged_reason or (
        f"{d.overall.positions} positions with the candidate's top-k on the oracle's context, fewer than "
        f"{MIN_POSITIONS}"
    )


def figures_line(d: RunDistribution) -> str:
    """The run's three judged figures in one line, with their limits where there is a floor."""
    f, fl = d.deciding, d.deciding_floor
    rate = None if f.same_top_rate is None else 100.0 * f.same_top_rate
    mean = f"mean KL {_pm(f.kl_mean_mnats, f.kl_se_mnats)} mnats"
    p99 = f"p99 KL {_n(f.kl_p99_mnats)} mnats"
    same = f"same top {_n(rate, 2)}%"
    if fl is not None and d.by_reference and f.kl_mean_mnats is not None:
        base = d.reference_baseline or 0.0
        mean += f" (the oracle's own {base:.3f}: excess {f.kl_mean_mnats - base:.3f}, limit {fl.kl_mean_limit:.3f})"
        p99 += f" (limit {fl.kl_p99_limit:.3f})"
    elif fl is not None:
        mean += f" (limit {fl.kl_mean_limit:.3f})"
        p99 += f" (limit {fl.kl_p99_limit:.3f})"
        same += f" (limit {100 * (1 - fl.same_top_miss_limit):.2f}%)"
    vs = "vs the float32 reference: " if d.by_reference else ""
    return f"{vs}{mean}, {p99}, {same}; {f.positions} positions sharing the oracle's context"


def distribution_summary_lines(result: GateResult) -> list[tuple[str, str]]:
    """The block at a glance: the verdict line, then the judged figures in one line."""
    d = result.distribution
    if d is None:
        return []
    verdict = floor_line(d, result)
    if d.overall.positions == 0:
        return [verdict, ("no top-k from the candidate at positions sharing the oracle's context", QUIET)]
    own = free_forced_line(d)
    return [verdict, (figures_line(d), QUIET), *([(own, QUIET)] if own else [])]


def free_forced_line(d: RunDistribution) -> str:
    """The candidate's free-run lists against its forced ones where both saw one context
    (empty: no such position)."""
    ff = d.free_forced
    if ff is None or not ff.positions:
        return ""
    mean = f"mean KL {_n(ff.kl_mean_mnats)} mnats"
    p99 = f"p99 KL {_n(ff.kl_p99_mnats)} mnats"
    if d.floor is not None:
        mean += f" (limit {d.floor.kl_mean_limit:.3f})"
        p99 += f" (limit {d.floor.kl_p99_limit:.3f})"
    return (
        f"free run vs forced decode (the candidate against itself): {mean}, {p99}, max {_n(ff.kl_max_mnats)} "
        f"mnats; {ff.positions} positions in {ff.prompts} prompts where it reported both"
    )


def distribution_detail_lines(result: GateResult) -> list[tuple[str, str]]:
    """The long part: how the figures are measured, llama.cpp's block, by class, the floor's
    provenance."""
    d = result.distribution
    if d is None or d.overall.positions == 0:
        return []
    head = (
        f"distribution vs the oracle at {d.overall.positions} positions sharing its context (free-run prefix and "
        "forced, the worse of the two where both; KL(oracle ‖ candidate) over both lists, an oracle token the "
        "candidate lacks at its smallest listed probability)"
    )
    lines = [(head, QUIET), *((x, QUIET) for x in figure_lines(d.overall)), (class_line(d), QUIET)]
    if d.overall.no_common_support:
        lines.append((f"  {d.overall.no_common_support} positions with no token in common", QUIET))
    if d.reference is not None:
        lines.append(("distribution vs the pin's float32 reference at the same positions:", QUIET))
        lines.extend((x, QUIET) for x in figure_lines(d.reference))
    if d.deciding_floor is not None:
        lines.append((floor_provenance(d), QUIET))
    return lines


def distribution_lines(result: GateResult) -> list[tuple[str, str]]:
    """The whole block as (line, style) pairs, the verdict line last; style is "loud",
    "quiet" or "plain". Empty when the result carries no distribution (built by hand)."""
    d = result.distribution
    if d is None:
        return []
    return [*distribution_detail_lines(result), *distribution_summary_lines(result)[1:], floor_line(d, result)]


# Rich styles of the terminal report, by the kind `distribution_lines` names.
DISTRIBUTION_STYLES = {LOUD: "bold red", QUIET: "dim", PLAIN: "bold yellow"}


def distribution_markdown(result: GateResult, cell: Callable[[str], str]) -> list[str]:
    """The block for the Markdown report: the verdict line in bold and the judged figures;
    `cell` is the report's escaping. The long part is `distribution_detail_lines`."""
    lines = distribution_summary_lines(result)
    if not lines:
        return []
    (verdict, _), *rest = lines
    return ["### Distribution", "", f"**{cell(verdict)}**", "", *(cell(line) for line, _ in rest), ""]


def distribution_html(result: GateResult) -> str:
    """The block for the HTML report's own section: the verdict line, the judged figures,
    then llama.cpp's block (escaped: the figures hold no trace text)."""
    from html import escape

    lines = distribution_summary_lines(result)
    if not lines:
        return ""
    (verdict, kind), *rest = lines
    d = result.distribution
    assert d is not None
    block = [*figure_lines(d.overall), class_line(d)] if d.overall.positions else []
    figures = "\n".join(escape(line) for line in block)
    return (
        f'<p class="dverdict {kind}">{escape(verdict)}</p>'
        + "".join(f"<p>{escape(line)}</p>" for line, _ in rest)
        + (f"<pre>{figures}</pre>" if figures else "")
    )


def junit_distribution_case(result: GateResult, suites: Any, suite: Any, classname: str) -> None:
    """A failing testcase `distribution` when the run is beyond the honest floor, so that a CI
    dashboard counting testcases never shows green for a failed gate."""
    import xml.etree.ElementTree as ET

    d = result.distribution
    if d is None or not (d.beyond or d.insufficient or d.disagrees):
        return
    verdict, _ = floor_line(d, result)
    case = ET.SubElement(suite, "testcase", classname=classname, name="distribution", time="0")
    failure = ET.SubElement(case, "failure", message=verdict, type="distribution")
    failure.text = "\n".join(line for line, _ in distribution_lines(result))
    for element in (suites, suite):
        element.set("tests", str(int(element.get("tests", "0")) + 1))
        element.set("failures", str(int(element.get("failures", "0")) + 1))
