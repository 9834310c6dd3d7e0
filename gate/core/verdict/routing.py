"""Routing attribution: which divergences an MoE router flip explains (docs/guides/moe-routing.md).

Pure: numpy over the traces' routing fields, no torch, no I/O.

For a divergence at generated position p, the candidate's context up to p is the oracle's
(free run: before the first divergence; forced: the oracle's tokens), so their routing can
be compared step by step. The first routing flip is the earliest input token, then the
lowest MoE layer, at which the candidate's set of experts differs from the oracle's, at or
before the step that produced position p. It is classified by the candidate router's own
gap between the two experts that swapped: the oracle's last-chosen expert the candidate
dropped, and the candidate's last-chosen substitute. The gap is the candidate's score of
its substitute minus its score of the oracle's expert, x1000: mnats of router logprob for
softmax routers (Qwen3-MoE, Qwen3.5/3.6 MoE, Mixtral), thousandths of the biased sigmoid
score for DeepSeek-style routers. The classes are the token doctrine's: a gap of exactly
0.0 is an exact tie (with the direction of the candidate's tie-break), one within the
near-tie threshold a near tie, anything larger a defect upstream of the router's top-k.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from gate.core.traces.moe import (
    SCORE_LOGPROB,
    MoeInfo,
    RoutingFlip,
    RoutingSummary,
    moe_of,
)
from gate.core.traces.trace import PromptRecord, Trace
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.result import DEFECT, EXACT_TIE, FREE_RUN, NEAR_TIE, Divergence, GateResult
from gate.errors import InputError


def attribute_routing(
    result: GateResult, oracle: Trace, candidate: Trace, doctrine: Doctrine | None = None
) -> GateResult:
    """`result` with each divergence's first routing flip and a routing summary; unchanged
    when the oracle has no routing (a dense model, or a pin recorded without it)."""
    moe = moe_of(oracle.header.extra)
    if moe is None:
        return result
    doctrine = doctrine or result.doctrine
    cmoe = moe_of(candidate.header.extra)
    if cmoe is not None and (cmoe.layers != moe.layers or cmoe.top_k != moe.top_k):
        raise InputError(
            f"{candidate.path}: routes through MoE layers {list(cmoe.layers)} with top_k {cmoe.top_k}, the oracle "
            f"{oracle.path} through {list(moe.layers)} with top_k {moe.top_k}: not the same model"
        )
    replayed = cmoe is not None and (cmoe.extra or {}).get("routing") == "oracle"
    score = str((cmoe.extra or {}).get("score", SCORE_LOGPROB)) if cmoe is not None else SCORE_LOGPROB
    o_by, c_by = oracle.by_id(), candidate.by_id()
    divs: list[Divergence] = []
    classes = {EXACT_TIE: 0, NEAR_TIE: 0, DEFECT: 0}
    missing = 0
    for d in result.divergences:
        o, c = o_by.get(d.prompt_id), c_by.get(d.prompt_id)
        rows = _rows(o, c, d.source) if o is not None and c is not None and cmoe is not None else None
        if rows is None:
            missing += 1
            divs.append(d)
            continue
        assert o is not None
        flip = first_flip(
            *rows,
            prompt_len=len(o.prompt_token_ids),
            position=d.position,
            moe=moe,
            near_tie_mnats=doctrine.near_tie_mnats,
            score=score,
        )
        if flip is not None:
            classes[flip.cls] += 1
        divs.append(replace(d, routing_flip=flip))
    summary = RoutingSummary(
        replayed=replayed,
        divergences=len(divs),
        routing_caused=sum(classes.values()),
        exact_ties=classes[EXACT_TIE],
        near_ties=classes[NEAR_TIE],
        defects=classes[DEFECT],
        without_routing_data=missing,
        router_disagreements=_disagreements(oracle, candidate, result) if replayed else 0,
        source=moe.source,
    )
    return replace(result, divergences=tuple(divs), routing=summary)


Rows = tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]


def _rows(o: PromptRecord, c: PromptRecord, source: str) -> Rows | None:
    """(oracle experts, candidate experts, candidate router ids, scores) for the candidate's
    free run or forced decode; None where either side has no routing."""
    orows = _array(o.routed_experts, np.int64)
    free = source == FREE_RUN
    crows = _array(c.routed_experts if free else c.forced_routed_experts, np.int64)
    if orows is None or crows is None:
        return None
    top = c.router_top if free else c.forced_router_top
    ids = scores = None
    if isinstance(top, list) and top:
        arr = np.asarray(top, dtype=np.float64)  # [n, layers, m, 2]
        ids, scores = arr[..., 0].astype(np.int64), arr[..., 1]
    return orows, crows, ids, scores


def _array(value: Any, dtype: Any) -> np.ndarray | None:
    if value is None:
        return None
    arr = np.asarray(value, dtype=dtype)
    return arr if arr.ndim == 3 else None


def differing(orows: np.ndarray, crows: np.ndarray) -> np.ndarray:
    """[n, layers] bool: where the two sides' expert sets differ (order within a set aside)."""
    n = min(len(orows), len(crows))
    return (np.sort(orows[:n], axis=2) != np.sort(crows[:n], axis=2)).any(axis=2)


def first_flip(
    orows: np.ndarray,
    crows: np.ndarray,
    top_ids: np.ndarray | None,
    top_scores: np.ndarray | None,
    *,
    prompt_len: int,
    position: int,
    moe: MoeInfo,
    near_tie_mnats: float,
    score: str = SCORE_LOGPROB,
) -> RoutingFlip | None:
    """The earliest (input token, then MoE layer) routing difference at or before the step
    that produced generated `position`, classified; None when routing agrees throughout."""
    last = prompt_len - 1 + position
    diff = differing(orows[: last + 1], crows[: last + 1])
    hits = np.argwhere(diff)
    if not len(hits):
        return None
    t, j = (int(x) for x in hits[0])  # argwhere is row-major: earliest token, then lowest layer
    o_set, c_set = [int(e) for e in orows[t, j]], [int(e) for e in crows[t, j]]
    dropped = [e for e in o_set if e not in c_set]
    taken = [e for e in c_set if e not in o_set]
    s: dict[int, float] = {}
    if top_ids is not None and top_scores is not None and t < len(top_ids):
        s = dict(zip(top_ids[t, j].tolist(), top_scores[t, j].tolist(), strict=True))
    # The closest swap by the candidate's own scores: the dropped oracle expert it scored
    # highest, against the substitute it scored lowest (in list order where unscored).
    low = -float("inf")
    e_o = max(reversed(dropped), key=lambda e: s.get(e, low))
    e_c = min(reversed(taken), key=lambda e: s.get(e, float("inf")))
    gap: float | None = None
    bound: float | None = None
    if e_o in s and e_c in s:
        gap = 1000.0 * (s[e_c] - s[e_o])
    elif e_c in s and s:
        bound = 1000.0 * (s[e_c] - min(s.values()))
    if gap is not None and gap == 0.0:
        cls, tie_break = EXACT_TIE, ("lower_id" if e_c < e_o else "higher_id")
    elif gap is not None and abs(gap) <= near_tie_mnats:
        cls, tie_break = NEAR_TIE, None
    else:
        cls, tie_break = DEFECT, None
    return RoutingFlip(
        layer=moe.layers[j],
        token_index=t,
        position=t - (prompt_len - 1) if t >= prompt_len - 1 else None,
        oracle_expert=e_o,
        candidate_expert=e_c,
        router_gap_mnats=gap,
        gap_lower_bound_mnats=bound,
        cls=cls,
        tie_break=tie_break,
        oracle_experts=tuple(o_set),
        candidate_experts=tuple(c_set),
        score=score,
    )


def _disagreements(oracle: Trace, candidate: Trace, result: GateResult) -> int:
    """Under replay: router steps (token x layer) where the oracle's experts are not a top-k
    of the candidate's own scores (an oracle expert scored strictly below one it left out,
    or outside the recorded scores; ties either way agree), over the steps whose context
    is the oracle's."""
    o_by = oracle.by_id()
    first = {p.id: p.first_divergence for p in result.prompts}
    total = 0
    for c in candidate.records:
        o = o_by.get(c.id)
        if o is None:
            continue
        forced = c.forced_router_top is not None
        top = c.forced_router_top if forced else c.router_top
        orows = _array(o.routed_experts, np.int64)
        if not isinstance(top, list) or not top or orows is None:
            continue
        arr = np.asarray(top, dtype=np.float64)  # [n, layers, m, 2]
        stop = min(len(arr), len(orows))
        p = first.get(c.id)
        if not forced and p is not None:
            stop = min(stop, len(o.prompt_token_ids) + p)
        for t in range(stop):
            for j in range(arr.shape[1]):
                scores = dict(zip(arr[t, j, :, 0].astype(np.int64).tolist(), arr[t, j, :, 1].tolist(), strict=True))
                chosen = set(orows[t, j].tolist())
                if not chosen <= scores.keys():
                    total += 1
                    continue
                left = [v for e, v in scores.items() if e not in chosen]
                if left and min(scores[e] for e in chosen) < max(left):
                    total += 1
    return total


def oracle_routing(trace: Trace) -> Mapping[tuple[int, ...], list[Any]]:
    """The oracle's recorded experts by prompt token ids: what `routing=oracle` replays."""
    out: dict[tuple[int, ...], list[Any]] = {}
    for r in trace.records:
        rows = r.routed_experts
        if isinstance(rows, list):
            out[tuple(r.prompt_token_ids)] = rows
    return out
