"""Adjudication: pure functions over token ids and logprobs (no I/O, no torch).

`compare(oracle, candidate, doctrine) -> GateResult` implements the spec's rules:
prompt matching, the free-run first divergence, every forced mismatch, the gaps, the
class, the tie-break direction, the counts and the verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gate.core.traces.digest import trace_sha256
from gate.core.traces.trace import FORCED_TOP_KEY, PromptRecord, TopList, Trace, TraceHeader
from gate.core.verdict.consistency import check_something_to_compare, header_warnings
from gate.core.verdict.distribution import measure_distribution
from gate.core.verdict.doctrine import DEFAULT_DTYPE, Doctrine
from gate.core.verdict.evidence import RunDrift, candidate_margin, evidence_verdict, run_drift
from gate.core.verdict.grid import grid_step, logprob_slack
from gate.core.verdict.own_lists import CandidateEvidence, OwnLists, candidate_evidence
from gate.core.verdict.result import (
    _SEVERITY,
    ALTERNATIVES_SHOWN,
    DEFECT,
    EXACT_TIE,
    FORCED,
    FREE_RUN,
    NEAR_TIE,
    OUTCOME_MATCH,
    OUTCOME_OF_CLASS,
    OUTCOME_UNADJUDICATED,
    Divergence,
    GateResult,
    PromptResult,
)
from gate.core.verdict.rules import (
    RULE_BEYOND_GRID,
    RULE_BEYOND_MNATS,
    RULE_DRIFT_BEYOND,
    RULE_EVIDENCE,
    RULE_EXACT_TIE,
    RULE_GRID,
    RULE_MNATS,
    RULE_NO_LIST,
    RULE_NOT_GREEDY,
    RULE_NOT_IN_TOP_K,
    RULE_RAN_OUT,
)
from gate.errors import InputError

# --------------------------------------------------------------------------- classification


def classify(
    *,
    prompt_id: str,
    position: int,
    source: str,
    top: TopList,
    oracle_token: int,
    candidate_token: int | None,
    doctrine: Doctrine,
    top_logit: float | None = None,
    candidate_top: TopList | None = None,
    drift: RunDrift | None = None,
    not_greedy: bool = False,
) -> Divergence:
    """Classify one position where the candidate took `candidate_token` and the oracle `oracle_token`.

    `candidate_top` (the candidate's own top-k at this position) and `drift` (the run's) are
    the evidence the doctrine's `evidence` rule weighs. Without a list here (or one lacking
    either token) the rule gives no allowance in grid steps, wherever the candidate's other
    lists are: a doctrine that asks for the candidate's lists is not passed by their
    absence, and less evidence never ratifies more. A candidate that is not
    greedy over its own lists (`not_greedy`) earns no allowance at all. The divergence's
    `rule` names what decided it (`gate.core.verdict.rules`)."""
    lps = {int(t): float(lp) for t, lp in top}
    o_lp = lps[oracle_token]
    top2 = 1000.0 * (float(top[0][1]) - float(top[1][1])) if len(top) >= 2 else None
    step = grid_step(top_logit, doctrine.dtype or DEFAULT_DTYPE) if top_logit is not None else None
    ev = doctrine.evidence
    # The evidence rule's unit: the grid step at the top logit, floored (`Evidence`).
    unit = (
        grid_step(ev.unit_logit(top_logit), doctrine.dtype or DEFAULT_DTYPE)
        if ev is not None and top_logit is not None
        else None
    )
    base: dict[str, Any] = {
        "prompt_id": prompt_id,
        "position": position,
        "source": source,
        "oracle_token": oracle_token,
        "candidate_token": candidate_token,
        "top2_gap_mnats": top2,
        "oracle_logprob": o_lp,
        "ulp_mnats": 1000.0 * step if step is not None else None,
        "unit_mnats": 1000.0 * unit if unit is not None else None,
    }
    if candidate_token is None or candidate_token not in lps:
        lowest = min(lps.values())
        return Divergence(
            **base,
            cls=DEFECT,
            oracle_minus_candidate_mnats=None,
            gap_lower_bound_mnats=1000.0 * (o_lp - lowest),
            candidate_rank=None,
            tie_break=None,
            rule=RULE_RAN_OUT if candidate_token is None else RULE_NOT_IN_TOP_K,
        )
    c_lp = lps[candidate_token]
    gap = 1000.0 * (o_lp - c_lp)
    # Rank in the order torch.argmax would choose: logprob descending, then lowest id.
    rank = 1 + sum(1 for t, lp in lps.items() if lp > c_lp or (lp == c_lp and t < candidate_token))
    # In nats straight from the logprobs: a round trip through mnats could add a rounding.
    gap_ulps = (o_lp - c_lp) / step if step is not None else None
    gap_units = (o_lp - c_lp) / unit if unit is not None else None
    margin = candidate_margin(candidate_top, oracle_token, candidate_token, unit) if unit is not None else None
    tie_break: str | None = None
    if c_lp == o_lp:
        tie_break = "lower_id" if candidate_token < oracle_token else "higher_id"
    if not_greedy:
        # Its lists contradict its own choices somewhere: its flips prove nothing (a
        # sampler with a penalty left on, logprobs taken before it).
        cls, rule = DEFECT, RULE_NOT_GREEDY
    elif tie_break is not None:
        cls, rule = EXACT_TIE, RULE_EXACT_TIE
    else:
        cls, rule = _near_or_defect(o_lp, c_lp, gap, step, unit, margin, doctrine, candidate_top, drift)
    return Divergence(
        **base,
        cls=cls,
        oracle_minus_candidate_mnats=gap,
        gap_lower_bound_mnats=None,
        candidate_rank=rank,
        tie_break=tie_break,
        candidate_logprob=c_lp,
        gap_ulps=gap_ulps,
        candidate_margin_ulps=margin,
        gap_units=gap_units,
        rule=rule,
    )


def _near_or_defect(
    o_lp: float,
    c_lp: float,
    gap: float,
    step: float | None,
    unit: float | None,
    margin: float | None,
    doctrine: Doctrine,
    candidate_top: TopList | None,
    drift: RunDrift | None,
) -> tuple[str, str]:
    """(class, rule) of a flip that is not an exact tie: the first rule that ratifies it,
    else the limit that failed."""
    if 0.0 < gap <= doctrine.near_tie_mnats:
        return NEAR_TIE, RULE_MNATS
    ev = doctrine.evidence
    if step is None:  # no raw logits: only the fixed mnats apply
        return DEFECT, RULE_BEYOND_MNATS
    if drift is not None and drift.beyond:
        return DEFECT, RULE_DRIFT_BEYOND  # a run drifting beyond the doctrine earns no allowance in grid steps
    if ev is not None and margin is not None and unit is not None:
        failed = evidence_verdict(o_lp, c_lp, margin, unit, ev, candidate_top)
        return (NEAR_TIE, RULE_EVIDENCE) if failed is None else (DEFECT, failed)
    if ev is not None:
        # The doctrine asks for the candidate's own list here: its absence earns nothing
        # (before, a trace without any lists fell back to the grid rule, and dropping every
        # list turned a flip the evidence rule failed into a near tie).
        return DEFECT, RULE_NO_LIST
    if doctrine.near_tie_ulps is not None:
        if 0.0 < o_lp - c_lp <= doctrine.near_tie_ulps * step + logprob_slack(o_lp, c_lp):
            return NEAR_TIE, RULE_GRID
        return DEFECT, RULE_BEYOND_GRID
    return DEFECT, RULE_BEYOND_MNATS


# --------------------------------------------------------------------------- comparison


def compare(oracle: Trace, candidate: Trace, doctrine: Doctrine | None = None) -> GateResult:
    """Adjudicate a candidate trace against an oracle trace."""
    doctrine = doctrine or Doctrine()
    if oracle.role != "oracle":
        raise InputError(f"{oracle.path}: expected an oracle trace, found role {oracle.role!r}")
    if doctrine.near_tie_ulps is not None or doctrine.evidence is not None:
        doctrine = replace(doctrine, dtype=doctrine.dtype or oracle_dtype(oracle))
        grid_step(1.0, doctrine.dtype or DEFAULT_DTYPE)  # an unknown dtype is an input error here
    if candidate.role != "candidate":
        raise InputError(f"{candidate.path}: expected a candidate trace, found role {candidate.role!r}")
    cand = candidate.by_id()
    oracle_ids = [r.id for r in oracle.records]
    missing = [i for i in oracle_ids if i not in cand]
    if missing:
        raise InputError(f"{candidate.path}: missing prompt(s) {_few(missing)} that the oracle {oracle.path} has")
    known = set(oracle_ids)
    extra = [r.id for r in candidate.records if r.id not in known]
    if extra:
        raise InputError(f"{candidate.path}: prompt(s) {_few(extra)} are not in the oracle {oracle.path}")

    check_something_to_compare(oracle, candidate)
    warnings = header_warnings(oracle, candidate)

    # The candidate's own lists, checked once (forced lists validated, greedy over its lists).
    own = candidate_evidence(oracle, candidate)
    drift = None
    if doctrine.evidence is not None:
        dtype, ev = doctrine.dtype or DEFAULT_DTYPE, doctrine.evidence
        drift = run_drift(
            oracle,
            candidate,
            lambda v: grid_step(ev.unit_logit(v), dtype),
            limit_ulps=ev.drift_ulps,
            tail_limit_ulps=ev.tail_limit_ulps,
            evidence=own,
        )
    prompts: list[PromptResult] = []
    divergences: list[Divergence] = []
    for o in oracle.records:
        pr, divs = compare_prompt(
            o,
            cand[o.id],
            doctrine,
            oracle_path=oracle.path,
            candidate_path=candidate.path,
            drift=drift,
            evidence=own,
        )
        prompts.append(pr)
        divergences.extend(divs)
    return GateResult(
        doctrine=doctrine,
        prompts=tuple(prompts),
        divergences=tuple(divergences),
        model=oracle.header.model,
        oracle_engine=str(oracle.header.engine.get("name", "")),
        candidate_engine=str(candidate.header.engine.get("name", "")),
        warnings=warnings,
        drift=drift,
        not_greedy=own.not_greedy,
        not_greedy_total=own.not_greedy_total,
        distribution=measure_distribution(
            oracle, candidate, {p.id: p.outcomes for p in prompts}, doctrine.floor, evidence=own
        ),
        oracle_sha256=trace_sha256(oracle),
    )


def candidate_evidence_of(o: PromptRecord, c: PromptRecord, candidate_path: str = "candidate") -> CandidateEvidence:
    """`candidate_evidence` of one prompt pair (for `compare_prompt` called on its own)."""
    head = TraceHeader(role="oracle", model="", top_k=1, engine={})
    ctop = max((len(p) for p in c.extra.get(FORCED_TOP_KEY) or ()), default=1)
    chead = TraceHeader(role="candidate", model="", top_k=max(ctop, 1), engine={})
    return candidate_evidence(Trace(head, (o,)), Trace(chead, (c,), path=candidate_path))


def oracle_dtype(trace: Trace) -> str:
    """The model dtype a trace's header names (`dtype`, else `engine.dtype`), else bfloat16."""
    for source in (trace.header.extra, trace.header.engine):
        value = source.get("dtype")
        if isinstance(value, str) and value:
            return value.removeprefix("torch.")
    return DEFAULT_DTYPE


def _few(ids: Sequence[str]) -> str:
    shown = ", ".join(repr(i) for i in ids[:5])
    return shown + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def _text(rec: PromptRecord, i: int) -> str | None:
    return rec.tokens[i] if rec.tokens is not None and i < len(rec.tokens) else None


def compare_prompt(
    o: PromptRecord,
    c: PromptRecord,
    doctrine: Doctrine,
    *,
    oracle_path: str = "oracle",
    candidate_path: str = "candidate",
    drift: RunDrift | None = None,
    evidence: CandidateEvidence | None = None,
) -> tuple[PromptResult, list[Divergence]]:
    if c.prompt_token_ids != o.prompt_token_ids:
        j = next(
            (k for k, (a, b) in enumerate(zip(o.prompt_token_ids, c.prompt_token_ids, strict=False)) if a != b),
            min(len(o.prompt_token_ids), len(c.prompt_token_ids)),
        )
        oa = o.prompt_token_ids[j] if j < len(o.prompt_token_ids) else "end"
        ca = c.prompt_token_ids[j] if j < len(c.prompt_token_ids) else "end"
        raise InputError(
            f"prompt {o.id!r}: prompt_token_ids differ at index {j} (oracle {oa}, candidate {ca}; "
            f"{len(o.prompt_token_ids)} vs {len(c.prompt_token_ids)} tokens): tokenizer or chat-template "
            f"drift between {oracle_path} and {candidate_path}, not a divergence"
        )
    top = o.top_logprobs
    assert top is not None  # the reader guarantees it for oracle records
    n = len(o.token_ids)
    ot, ct = o.token_ids, c.token_ids
    if ct[:n] == ot:  # the common case, compared in C
        matched, first = n, None
    else:
        matched = sum(1 for i in range(min(n, len(ct))) if ct[i] == ot[i])
        first = next((i for i in range(n) if i >= len(ct) or ct[i] != ot[i]), None)
    logits = o.extra.get("token_logits")
    top_logits: Sequence[Any] | None = logits if isinstance(logits, list) and len(logits) == n else None

    ev = evidence if evidence is not None else candidate_evidence_of(o, c, candidate_path)
    own: OwnLists = ev.own(c.id)
    not_greedy = ev.not_greedy_total > 0

    def make(i: int, source: str, cand_token: int | None, mode: str | None = None) -> Divergence:
        tl = top_logits[i] if top_logits is not None else None
        d = classify(
            prompt_id=o.id,
            position=i,
            source=source,
            top=top[i],
            oracle_token=ot[i],
            candidate_token=cand_token,
            doctrine=doctrine,
            top_logit=float(tl) if isinstance(tl, (int, float)) else None,
            candidate_top=own.at(source, i) if cand_token is not None else None,
            drift=drift,
            not_greedy=not_greedy,
        )
        vocab = texts()
        alts = tuple((int(t), float(lp), vocab.get(int(t))) for t, lp in top[i][:ALTERNATIVES_SHOWN])
        if cand_token is None:
            cand_text = None
        elif source == FREE_RUN:
            cand_text = _text(c, i)
        else:  # forced: the candidate's own text at i is of its free run; look the id up
            cand_text = vocab.get(cand_token)
        return replace(d, oracle_text=_text(o, i), candidate_text=cand_text, alternatives=alts, forced_mode=mode)

    vocab_cache: list[dict[int, str]] = []

    def texts() -> dict[int, str]:
        # Decoded text of every id either side wrote in this prompt: labels for alternatives.
        if not vocab_cache:
            vocab: dict[int, str] = {}
            for rec in (c, o):
                if rec.tokens is not None:
                    vocab.update(zip(rec.token_ids, rec.tokens, strict=False))
            vocab_cache.append(vocab)
        return vocab_cache[0]

    divs: dict[int, Divergence] = {}
    self_contradictions = 0
    if first is not None:
        divs[first] = make(first, FREE_RUN, ct[first] if first < len(ct) else None)
    forced = c.forced_token_ids
    forced_mode = c.extra.get("forced_mode")
    if forced is not None:
        if len(forced) != n:
            raise InputError(
                f"{candidate_path}: prompt {o.id!r}: forced_token_ids has {len(forced)} entries, "
                f"the oracle's token_ids {n}"
            )
        if forced != ot:
            mode = forced_mode if isinstance(forced_mode, str) else None
            for i in range(n):
                if forced[i] == ot[i]:
                    continue
                if i not in divs:
                    divs[i] = make(i, FORCED, forced[i], mode)
                elif i < len(ct) and forced[i] != ct[i]:
                    # At the first divergence both runs saw the same context, yet chose
                    # differently: keep the worse of the two, so neither hides a defect.
                    other = make(i, FORCED, forced[i], mode)
                    if _SEVERITY[other.cls] > _SEVERITY[divs[i].cls]:
                        divs[i] = other
            # Up to the first divergence the oracle's prefix is the candidate's own free
            # run, so forced decoding should reproduce it. Where it does not, the engine's
            # forced path (a prefill, say) and its free run differ: classified like any
            # forced divergence. A tie there is honest kernel noise; a defect means the
            # engine is not deterministic or the file is inconsistent, and it fails the
            # prompt (below): a report never counts a defect and passes.
            self_contradictions = sum(
                1 for i in range(min(n, len(ct)) if first is None else first + 1) if i < len(ct) and forced[i] != ct[i]
            )
        unadjudicated = 0
        outcomes = OUTCOME_MATCH * n
    elif first is not None:
        unadjudicated = n - first - 1
        outcomes = OUTCOME_MATCH * first + OUTCOME_UNADJUDICATED * (n - first)  # `first` is set below
    else:
        unadjudicated = 0
        outcomes = OUTCOME_MATCH * n
    if divs:
        chars = list(outcomes)
        for i, d in divs.items():
            chars[i] = OUTCOME_OF_CLASS[d.cls]
        outcomes = "".join(chars)

    ordered = [divs[i] for i in sorted(divs)]
    ratified = all(d.cls != DEFECT for d in ordered)
    # Strict: the free run matches, and no defect was counted (forced data can find one
    # even where the free run matched: see above).
    strict = first is None and ratified
    return (
        PromptResult(
            id=o.id,
            strict=strict,
            ratified=ratified,
            positions=n,
            positions_matched=matched,
            first_divergence=first,
            unadjudicated=unadjudicated,
            extra_candidate_tokens=max(0, len(ct) - n),
            prompt=o.prompt if o.prompt is not None else c.prompt,
            outcomes=outcomes,
            forced_disagrees_with_free_run=self_contradictions,
        ),
        ordered,
    )
