"""Adjudication: pure functions over token ids and logprobs (no I/O, no torch).

`compare(oracle, candidate, doctrine) -> GateResult` implements the spec's rules:
prompt matching, the free-run first divergence, every forced mismatch, the counts and the
verdict. Each divergence's class, gaps and tie-break direction are decided in
`gate.core.verdict.chain` (`classify`, re-exported here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gate.core.traces.digest import trace_sha256
from gate.core.traces.trace import PromptRecord, Trace, TraceHeader
from gate.core.verdict.chain import classify, position_evidence
from gate.core.verdict.consistency import check_something_to_compare, header_warnings
from gate.core.verdict.coverage import prompt_coverage
from gate.core.verdict.distribution import measure_distribution
from gate.core.verdict.doctrine import DEFAULT_DTYPE, Doctrine
from gate.core.verdict.evidence import RunDrift, run_drift
from gate.core.verdict.grid import grid_step
from gate.core.verdict.own_lists import CandidateEvidence, OwnLists, candidate_evidence
from gate.core.verdict.result import (
    _SEVERITY,
    ALTERNATIVES_SHOWN,
    DEFECT,
    FORCED,
    FREE_RUN,
    OUTCOME_MATCH,
    OUTCOME_OF_CLASS,
    OUTCOME_UNADJUDICATED,
    Divergence,
    GateResult,
    PromptResult,
)
from gate.errors import InputError

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

    # The candidate's own lists, checked once (forced lists matched, greedy over its lists).
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
    complete = all(lists_complete(o, cand[o.id], own, oracle.header.top_k) for o in oracle.records)
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
            complete=complete,
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
            oracle,
            candidate,
            {p.id: p.outcomes for p in prompts},
            doctrine.floor,
            evidence=own,
            reference_floor=doctrine.reference_floor,
        ),
        oracle_sha256=trace_sha256(oracle),
    )


def lists_complete(o: PromptRecord, c: PromptRecord, evidence: CandidateEvidence, top_k: int) -> bool:
    """The candidate's lists are all there at the prompt's positions that share the oracle's
    context (none absent, empty or shorter than the oracle's `top_k` asks: `coverage`)."""
    _, missing, short, _ = prompt_coverage(o, c, evidence.own(c.id), top_k)
    return not missing and not short


def candidate_evidence_of(o: PromptRecord, c: PromptRecord, candidate_path: str = "candidate") -> CandidateEvidence:
    """`candidate_evidence` of one prompt pair (for `compare_prompt` called on its own)."""
    head = TraceHeader(role="oracle", model="", top_k=1, engine={})
    ctop = max((len(p) for p in c.forced_top_logprobs or ()), default=1)
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
    complete: bool | None = None,
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
    logits = o.token_logits
    top_logits: Sequence[Any] | None = logits if logits is not None and len(logits) == n else None

    ev = evidence if evidence is not None else candidate_evidence_of(o, c, candidate_path)
    own: OwnLists = ev.own(c.id)
    not_greedy = ev.not_greedy_total > 0
    if complete is None:  # called on its own: this prompt's lists are the run's
        complete = lists_complete(o, c, ev, len(top[0]) if top else 1)

    def make(i: int, source: str, cand_token: int | None, mode: str | None = None) -> Divergence:
        tl = top_logits[i] if top_logits is not None else None
        evidence_here = position_evidence(
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
            lists_complete=complete,
        )
        d = classify(evidence_here, doctrine)
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
    forced_mode = c.forced_mode
    if forced is not None:
        if len(forced) != n:
            raise InputError(
                f"{candidate_path}: prompt {o.id!r}: forced_token_ids has {len(forced)} entries, "
                f"the oracle's token_ids {n}"
            )
        if forced != ot:
            mode = forced_mode
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
