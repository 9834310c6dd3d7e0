"""The verdict and its reason in one sentence, the first thing every report says.

`reason(result)` reads only the result's own fields (each divergence's class and rule, the
distribution's figures, floor and verdict, the doctrine's strictness), so the sentence is
true of what the verdict decided: which rule or which floor, by how much, where.

    FAIL: 4 defects (rule oracle_gap_beyond ×3, not_in_top_k ×1; largest gap 812.4 mnats at
    prompt 'num-squares' position 12), and the distribution is beyond the honest floor
    (mean KL 3.480 mnats > 2.088)
"""

from __future__ import annotations

from collections import Counter

from gate.core.verdict.result import DEFECT, EXACT_TIE, NEAR_TIE, RATIFIED_PASS, STRICT_PASS, Divergence, GateResult
from gate.reports._common import class_counts, fmt_mnats
from gate.text import plural, printable

HEADLINES = {STRICT_PASS: "STRICT PASS", RATIFIED_PASS: "RATIFIED PASS", "fail": "FAIL"}


def headline(result: GateResult) -> str:
    """`FAIL` / `RATIFIED PASS` / `STRICT PASS`, and `(exit 1 under --strict)` where the
    exit code is not the verdict's usual one."""
    v = result.verdict
    word = HEADLINES.get(v, v.upper())
    if v == RATIFIED_PASS and result.exit_code != 0:
        word += " (exit 1 under --strict)"
    return word


def reason(result: GateResult) -> str:
    """The verdict and why, in one sentence (no trailing period)."""
    return f"{headline(result)}: {because(result)}"


def because(result: GateResult) -> str:
    """The reason without the verdict word."""
    tokens = _token_clause(result)
    dist = _distribution_clause(result)
    return f"{tokens}, and {dist}" if dist else tokens


def _worst(d: Divergence) -> float:
    if d.oracle_minus_candidate_mnats is not None:
        return d.oracle_minus_candidate_mnats
    if d.gap_lower_bound_mnats is not None:
        return d.gap_lower_bound_mnats
    return float("inf")  # stopped early: no gap, and worse than any


def _where(d: Divergence) -> str:
    return f"at prompt {printable(repr(d.prompt_id))} position {d.position}"


def _gap(d: Divergence) -> str:
    if d.candidate_token is None:
        return "the candidate stopped early"
    if d.oracle_minus_candidate_mnats is not None:
        return f"gap {fmt_mnats(d.oracle_minus_candidate_mnats)} mnats"
    if d.gap_lower_bound_mnats is not None:
        return f"gap ≥ {fmt_mnats(d.gap_lower_bound_mnats)} mnats (not in the oracle's top-k)"
    return "gap unknown"


def _token_clause(result: GateResult) -> str:
    c = result.counts
    prompts = c["prompts"]
    defects = [d for d in result.divergences if d.cls == DEFECT and not d.want_of_evidence]
    unweighed = [d for d in result.divergences if d.want_of_evidence]
    if unweighed and not defects:
        worst = max(unweighed, key=_worst)
        failed = prompts - c["ratified_pass"]
        return (
            f"{plural(len(unweighed), 'divergence')} not judged for want of evidence in {plural(failed, 'prompt')} "
            f"of {prompts} (rule no_list: the candidate reports no usable list where the evidence rule needs one; "
            f"{'largest' if len(unweighed) > 1 else 'its'} {_gap(worst)} {_where(worst)})"
        )
    if defects:
        rules = Counter(d.rule or "near_tie_mnats" for d in defects)
        ruled = (
            f"rule {next(iter(rules))}"
            if len(rules) == 1
            else "rules " + ", ".join(f"{r} ×{n}" for r, n in rules.most_common())
        )
        worst = max(defects, key=_worst)
        largest = "largest" if len(defects) > 1 else "its"
        failed = prompts - c["ratified_pass"]
        return (
            f"{plural(len(defects), 'defect')} in {plural(failed, 'prompt')} of {prompts} "
            f"({ruled}; {largest} {_gap(worst)} {_where(worst)})"
            + (f" and {len(unweighed)} more not judged for want of evidence (rule no_list)" if unweighed else "")
        )
    not_ratified = prompts - c["ratified_pass"]
    if not_ratified:  # a prompt fails without a defect: say so, from its own record
        return f"{plural(not_ratified, 'prompt')} of {prompts} not ratified"
    diverged = [p for p in result.prompts if not p.strict]
    if not diverged:
        return f"every token of the {plural(prompts, 'prompt')} is the oracle's ({c['positions']} positions)"
    ties = [d for d in result.divergences if d.cls in (EXACT_TIE, NEAR_TIE)]
    where = ""
    if ties:
        worst = max(ties, key=_worst)
        where = f"; largest gap {fmt_mnats(worst.oracle_minus_candidate_mnats)} mnats {_where(worst)}"
    strict = " and --strict asks for every prompt strict" if result.doctrine.strict else ""
    return (
        f"{len(diverged)} of {plural(prompts, 'prompt')} diverge only at ties ({class_counts(ties) or 'none'}"
        f"{where}){strict}"
    )


def _distribution_clause(result: GateResult) -> str:
    d = result.distribution
    if d is None:
        return ""
    if d.deciding_floor is None:
        return f"the distribution is not judged: {no_floor_words(result)}"
    if d.insufficient:
        from gate.core.verdict.distribution import RULE_NOT_JUDGED

        return (
            f"the distribution is NOT JUDGED, which under the pin's floor is not a pass (rule {RULE_NOT_JUDGED}: "
            f"{printable(d.not_judged_reason or '')})"
        )
    if d.disagrees and d.free_forced is not None:
        from gate.core.verdict.free_forced import RULE_FREE_FORCED

        own = (
            f"the candidate's free run and forced decode disagree beyond the honest floor (rule {RULE_FREE_FORCED}: "
            + "; ".join(_short(x) for x in d.free_forced.beyond_figures)
            + ")"
        )
        if d.beyond:
            return (
                "the distribution is beyond the honest floor ("
                + "; ".join(_short(x) for x in d.beyond_figures)
                + f"), and {own}"
            )
        return own
    if d.beyond:
        return "the distribution is beyond the honest floor (" + "; ".join(_short(x) for x in d.beyond_figures) + ")"
    if d.judged:
        f, fl = d.deciding, d.deciding_floor
        assert fl is not None  # judged
        if d.by_reference and f.kl_mean_mnats is not None:
            base = d.reference_baseline or 0.0
            return (
                f"the distribution is within the honest floor (mean KL vs the float32 reference "
                f"{_n(f.kl_mean_mnats)} mnats, {_n(f.kl_mean_mnats - base)} beyond the oracle's own ≤ "
                f"{fl.kl_mean_limit:.3f}, {f.positions} positions)"
            )
        return (
            f"the distribution is within the honest floor (mean KL {_n(f.kl_mean_mnats)} mnats ≤ "
            f"{fl.kl_mean_limit:.3f}, {f.positions} positions)"
        )
    return f"the distribution is not judged: {printable(d.not_judged_reason or '')}"


def no_floor_words(result: GateResult) -> str:
    """Why there is no floor, true for the kind of oracle: a pin's, or a bare trace's."""
    if result.run is not None:
        return "the pin carries no honest floor"
    return "no honest floor was given (the oracle trace's header carries none)"


def _short(figure: str) -> str:
    """`mean KL 3.480 mnats > 2.088 (honest floor 1.74 x margin 1.2)` without its provenance
    (which the details section carries)."""
    return figure.split(" (", 1)[0]


def _n(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"
