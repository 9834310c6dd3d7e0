"""Wording and number formats the renderers share, so every report says the same thing."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

from gate.core.pins.pin import oracle_label
from gate.core.verdict.chain import RULE_BY_CODE, plain_rule
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.result import (
    DEFECT,
    EXACT_TIE,
    FAIL,
    FORCED,
    NEAR_TIE,
    RATIFIED_PASS,
    STRICT_PASS,
    Divergence,
    GateResult,
)
from gate.text import plural, printable

# The one-line reason an exact tie can split two honest engines.
TIE_BREAK_RULE = "torch.argmax and vLLM take the lowest id among equal maxima"

CLASS_LABELS = {EXACT_TIE: "exact tie", NEAR_TIE: "near tie", DEFECT: "defect"}
CLASS_PLURALS = {EXACT_TIE: "exact ties", NEAR_TIE: "near ties", DEFECT: "defects"}
VERDICT_LABELS = {STRICT_PASS: "strict pass", RATIFIED_PASS: "ratified pass", "fail": "fail"}


def fmt_mnats(x: float | None) -> str:
    """A gap in mnats. A tiny non-zero gap never prints as 0.0, which would read as a tie."""
    if x is None:
        return "—"
    if x == 0.0:
        return "0.0"
    if abs(x) < 0.05:
        return f"{x:.2e}"
    return f"{x:,.1f}"


def fmt_logprob(x: float | None) -> str:
    """Every digit (repr), so two bit-identical logprobs are visibly identical."""
    return "—" if x is None else repr(float(x))


def fmt_ulps(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def quote(text: str) -> str:
    """Token text in double quotes with control characters escaped (`"\\n"`, `"\\u0000"`),
    C1 controls and bidi overrides too (`printable`: JSON leaves those raw)."""
    return printable(json.dumps(text, ensure_ascii=False))


def for_humans(result: GateResult) -> GateResult:
    """`result` with every name that came from an input file made `printable`: prompt ids,
    the model, engine names, forced modes, warnings. Token texts and prompts are shown
    through `quote`, which escapes them itself. Every human report starts here; the JSON
    report keeps the values verbatim."""
    p = printable
    prompts = tuple(replace(x, id=p(x.id)) for x in result.prompts)
    divergences = tuple(
        replace(d, prompt_id=p(d.prompt_id), forced_mode=None if d.forced_mode is None else p(d.forced_mode))
        for d in result.divergences
    )
    meta = {k: p(v) if isinstance(v, str) else v for k, v in result.meta.items()}
    return replace(
        result,
        prompts=prompts,
        divergences=divergences,
        model=p(result.model),
        oracle_engine=p(result.oracle_engine),
        candidate_engine=p(result.candidate_engine),
        meta=meta,
        warnings=tuple(map(p, result.warnings)),
    )


def token_label(token: int | None, text: str | None) -> str:
    if token is None:
        return "none (stopped early)"
    return f"{token} {quote(text)}" if text is not None else str(token)


def source_label(d: Divergence) -> str:
    if d.source == FORCED:
        return f"forced ({d.forced_mode})" if d.forced_mode else "forced"
    return "free run"


def gap_label(d: Divergence) -> str:
    """`oracle − candidate` in mnats, or the lower bound when the candidate is outside the top-k."""
    if d.oracle_minus_candidate_mnats is not None:
        return fmt_mnats(d.oracle_minus_candidate_mnats)
    if d.gap_lower_bound_mnats is not None:
        return f"≥ {fmt_mnats(d.gap_lower_bound_mnats)}"
    return "—"


def tie_break_line(d: Divergence) -> str:
    """`higher_id: the candidate took 1445, the oracle 464; torch.argmax and vLLM take ...`."""
    return f"{d.tie_break}: the candidate took {d.candidate_token}, the oracle {d.oracle_token}; {TIE_BREAK_RULE}"


def why(d: Divergence, doctrine: Doctrine | float, *, with_rule: bool = True) -> str:
    """One sentence: why this divergence has its class. The words are those of the rule that
    decided it (`Divergence.rule`, its `sentence` in `gate.core.verdict.chain.CHAIN`); here
    only its figures are filled in, with the limit and the unit it was judged in (and, for an
    exact tie, the tie-break rule unless `with_rule` is off). `doctrine` may be the bare
    near-tie threshold in mnats."""
    doc = doctrine if isinstance(doctrine, Doctrine) else Doctrine(near_tie_mnats=float(doctrine))
    figures: dict[str, object] = {
        "below": f"{fmt_mnats(d.oracle_minus_candidate_mnats)} mnats",
        "steps": f" ({fmt_ulps(d.gap_ulps)} grid steps of its logit)" if d.gap_ulps is not None else "",
        "mnats": fmt_mnats(doc.near_tie_mnats),
        "unit": f"units of {fmt_mnats(d.unit_mnats)} mnats" if d.unit_mnats is not None else "units",
        "gap_units": fmt_ulps(d.gap_units),
        "margin_units": fmt_ulps(d.candidate_margin_ulps),
        "logprob": fmt_logprob(d.oracle_logprob),
        "direction": "higher" if d.tie_break == "higher_id" else "lower",
        "tie_rule": f"; {TIE_BREAK_RULE}" if with_rule else "",
        "candidate_token": d.candidate_token,
        "lower_bound": fmt_mnats(d.gap_lower_bound_mnats),
        "part": "forced decode" if d.source == FORCED else "free run",
    }
    if doc.evidence is not None:
        figures.update(oracle_ulps=doc.evidence.oracle_ulps, candidate_ulps=doc.evidence.candidate_ulps)
    if doc.near_tie_ulps is not None:
        figures["near_tie_ulps"] = doc.near_tie_ulps
    rule = RULE_BY_CODE.get(d.rule)
    if rule is None or rule.cls != d.cls:
        rule = plain_rule(d.cls)
    templates = [rule.wanting] if d.want_of_evidence and rule.wanting else []
    # Where this doctrine lacks a limit a sentence names, the next: the rule's own, its class's plain one.
    for template in [*templates, rule.sentence, plain_rule(d.cls).sentence]:
        try:
            sentence = template.format_map(figures)
            break
        except KeyError:
            continue
    if rule.aside and d.oracle_minus_candidate_mnats:
        sentence += rule.aside.format_map(figures)
    return sentence


def class_counts(divergences: Iterable[Divergence]) -> str:
    """`1 exact tie, 2 defects`; empty when there are none."""
    counts = Counter(d.cls for d in divergences)
    parts = []
    for cls in (EXACT_TIE, NEAR_TIE, DEFECT):
        n = counts.get(cls, 0)
        if n:
            parts.append(f"{n} {CLASS_LABELS[cls] if n == 1 else CLASS_PLURALS[cls]}")
    return ", ".join(parts)


def by_prompt(result: GateResult) -> dict[str, list[Divergence]]:
    out: dict[str, list[Divergence]] = {p.id: [] for p in result.prompts}
    for d in result.divergences:
        out.setdefault(d.prompt_id, []).append(d)
    return out


def verdict_line(result: GateResult) -> str:
    """`verdict: ratified pass (exit 0)`; a failure with each of its causes, the prompts'
    (`4 defects`) and the distribution's, so the last line never names one cause of two."""
    v = result.verdict
    note = " under --strict" if v == RATIFIED_PASS and result.doctrine.strict else ""
    causes = []
    not_ratified = sum(not p.ratified for p in result.prompts)
    if v == FAIL and not_ratified:
        counts = result.counts
        unjudged = counts.get("not_judged_for_want_of_evidence", 0)
        found = counts["defects"] - unjudged
        words = [plural(found, "defect")] if found else []
        words += [f"{unjudged} not judged for want of evidence"] if unjudged else []
        causes.append(" and ".join(words) or f"{plural(not_ratified, 'prompt')} not ratified")
    if result.distribution is not None and result.distribution.beyond:
        causes.append("numerics beyond honest drift, the distribution verdict")
    elif result.distribution is not None and result.distribution.insufficient:
        causes.append("the distribution verdict could not judge what the candidate reported")
    elif result.distribution is not None and result.distribution.disagrees:
        causes.append("the candidate's free run and forced decode disagree beyond honest drift")
    if causes:
        note += ": " + " and ".join(causes)
    return f"verdict: {VERDICT_LABELS.get(v, v)} (exit {result.exit_code}{note})"


def doctrine_line(result: GateResult) -> str:
    return doctrine_text(result.doctrine)


def doctrine_text(d: Doctrine) -> str:
    """`doctrine: near ties up to 125 mnats, ...` with where it came from."""
    parts = [f"near ties up to {fmt_mnats(d.near_tie_mnats)} mnats"]
    grid = f"{d.dtype or 'bfloat16'} grid steps"
    if d.evidence is not None:
        e = d.evidence
        units = f"units (the {d.dtype or 'bfloat16'} grid step at max(|top logit|, {e.floor_logit:g}))"
        parts.append(
            f"or, weighing the candidate's evidence, an oracle gap up to {e.oracle_ulps:g} {units} with the "
            f"candidate's own margin up to {e.candidate_ulps:g} and its drift up to {e.drift_ulps:g} (median over "
            f"the run, each prompt and each window of positions; p90 up to {e.tail_limit_ulps:g})"
        )
        if d.near_tie_ulps is not None:
            parts.append(f"without evidence {d.near_tie_ulps:g} {grid}")
    elif d.near_tie_ulps is not None:
        parts.append(f"or {d.near_tie_ulps:g} {grid}")
    parts.append("strict" if d.strict else "ratified passes allowed")
    line = "doctrine: " + ", ".join(parts)
    return line + (f" ({d.source})" if d.source else "")


def drift_line(result: GateResult) -> str | None:
    """The run's drift (evidence doctrine), loud when it is beyond the doctrine's limit."""
    drift = result.drift
    if drift is None:
        return None
    line = drift.line()
    if drift.beyond:
        line += (
            " — FAR BEYOND HONEST DRIFT: this candidate swings the gap between the oracle's top two tokens "
            "further than honest engines do across machines; every flip beyond the fixed mnats is a defect"
        )
    return line


def not_greedy_line(result: GateResult) -> str | None:
    """Where the candidate's own choice is not the top of the list it reports, said loudly:
    its lists are then no evidence, and every flip it makes is a defect."""
    total = result.not_greedy_total
    if not total:
        return None
    shown = ", ".join(
        f"{g.prompt_id}@{g.position} ({'forced' if g.source == FORCED else 'free run'}: took {g.chosen}, "
        + (f"{fmt_mnats(g.behind_mnats)} mnats below {g.best_token})" if g.behind_mnats is not None else "not listed)")
        for g in result.not_greedy[:3]
    )
    more = f" and {total - 3} more" if total > 3 else ""
    return (
        f"the candidate is not greedy over its own logprobs at {total} position{'s' if total != 1 else ''}: "
        f"{shown}{more} — its "
        "sampler does not take the top of the logprobs it reports (a penalty or a sampling setting left on?), "
        + (
            "so its lists earn no allowance and every flip is a defect"
            if result.doctrine.floor is not None
            else "so its lists earn no allowance: a flip is a tie only where the oracle's list alone makes it one"
        )
    )


def provenance_line(result: GateResult) -> str:
    parts = []
    if result.model:
        parts.append(f"model {result.model}")
    if result.oracle_engine or result.candidate_engine:
        oracle = result.oracle_engine
        named = f"{oracle_label(oracle)} ({oracle})" if oracle and oracle_label(oracle) != oracle else oracle
        parts.append(f"oracle {named or '?'} vs candidate {result.candidate_engine or '?'}")
    machine = result.run.machine if result.run is not None else None
    if machine and machine.get("pin") and machine.get("candidate"):
        parts.append(f"pin recorded on {machine['pin']}, candidate on {machine['candidate']}")
    return "; ".join(parts)


# --------------------------------------------------------------------------- Markdown text

# Characters Markdown (CommonMark with GitHub's extensions) may read as syntax anywhere in
# a line: emphasis, code, links and images (their brackets: a parenthesis or `!` is inert
# without them), raw HTML, autolinks and entities, tables, strikethrough, math.
_MD_PUNCT = re.compile(r"([\\`*_\[\]<>|~&$])")
# What GitHub turns into links or notifications after Markdown, on the page's text:
# URLs (`scheme://`, `www.`), e-mail addresses and @mentions (`@`), issue and pull
# request references (`#123`, `GH-123`), emoji shortcodes (`:name:`). A word joiner (U+2060,
# invisible, no line break) splits each trigger so nothing matches.
_WJ = "\u2060"
_MD_TRIGGERS = (
    (re.compile(r":(?=//)"), ":" + _WJ),
    (re.compile(r"(?i)(?<![a-z0-9])(www)(?=\\?\.)"), r"\1" + _WJ),
    (re.compile(r"@"), "@" + _WJ),
    (re.compile(r"(?<=#)(?=[0-9a-z])", re.I), _WJ),
    (re.compile(r"(?i)(?<![a-z0-9])(gh)(?=-[0-9])"), r"\1" + _WJ),
    (re.compile(r"(?i):(?=[a-z0-9_+-]+:)"), ":" + _WJ),
)


def markdown_text(text: str) -> str:
    """`text` from anywhere (a token, a prompt id, a model name, a sentence naming them)
    made inert in a Markdown report, for a table cell or a sentence alike: controls
    escaped (`printable`), newlines as `\\n`, every syntax character backslash-escaped,
    and every autolink, mention, reference or shortcode trigger split by a word joiner.
    The one escaping function of every Markdown writer."""
    out = _MD_PUNCT.sub(r"\\\1", printable(text))
    out = out.replace("\r", "\\r").replace("\n", "\\n")
    if re.match(r"([-+=]+|#{1,6})(\s|$)", out):
        out = "\\" + out  # a list item, a setext underline or a heading at a line's start
    out = re.sub(r"^(\d+)\.(?=\s|$)", r"\1\\.", out)  # an ordered list item
    for pattern, repl in _MD_TRIGGERS:
        out = pattern.sub(repl, out)
    return out


def markdown_code_block(lines: list[str]) -> list[str]:
    """`lines` as a fenced code block no line can close (the fence is longer than any run
    of backticks in them); controls escaped. GitHub links nothing inside a code block."""
    body = [printable(line) for line in lines]
    longest = max((len(run) for line in body for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, *body, fence]
