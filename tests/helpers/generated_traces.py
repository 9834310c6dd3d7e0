"""Generated oracle and candidate traces for the monotonicity properties (pure: numpy, no
torch): an oracle over a small vocabulary and a candidate whose logits are the oracle's plus
noise, recorded the way `gate run` records one."""

from __future__ import annotations

from typing import Any

import numpy as np

from gate.core.traces.trace import PromptRecord, Trace, TraceHeader
from gate.core.verdict.doctrine import Doctrine, Evidence
from gate.core.verdict.floor import Floor

TOP_K = 4
VOCAB = 12
PROMPTS, LENGTH = 4, 26  # 104 positions: judged (MIN_POSITIONS 100)
FLOOR = Floor(kl_mean_mnats=2.0, kl_p99_mnats=40.0, same_top_rate=0.9, margin=1.5, measured_by="test")
# The floor against the oracle's float32 reference lists (`reference_top_logprobs`, the
# oracle's logits less its own small rounding noise): where a doctrine carries it, it decides.
REFERENCE_FLOOR = Floor(kl_mean_mnats=1.5, kl_p99_mnats=30.0, same_top_rate=0.9, margin=1.5, measured_by="test")
REFERENCE_NOISE = 0.05
DOCTRINES = {
    "floor": Doctrine(floor=FLOOR),
    "reference floor": Doctrine(floor=FLOOR, reference_floor=REFERENCE_FLOOR),
    "evidence + reference floor": Doctrine(
        near_tie_ulps=2.0, evidence=Evidence(4.0, 2.0, 2.0), floor=FLOOR, reference_floor=REFERENCE_FLOOR
    ),
    "evidence + floor": Doctrine(near_tie_ulps=2.0, evidence=Evidence(4.0, 2.0, 2.0), floor=FLOOR),
    # A floor no generated candidate is beyond: the token rules decide, coverage still applies.
    "evidence + loose floor": Doctrine(
        near_tie_ulps=2.0, evidence=Evidence(4.0, 2.0, 2.0), floor=Floor(1e4, 1e5, 0.01, 1.5, "loose")
    ),
}
PROMPT = (1, 2, 3)


def _top(logits: np.ndarray) -> list[list[Any]]:
    """The top-k list of a distribution over VOCAB tokens (float32 logprobs, the spec's order)."""
    lps = logits - np.logaddexp.reduce(logits)
    order = sorted(range(VOCAB), key=lambda t: (-float(np.float32(lps[t])), t))[:TOP_K]
    return [[t, float(np.float32(lps[t]))] for t in order]


def _argmax(top: list[list[Any]]) -> int:
    return int(min(top, key=lambda p: (-p[1], p[0]))[0])


def build(seed: int, noise: float, bias: float = 0.0) -> tuple[Trace, Trace]:
    """An oracle and a candidate whose logits are the oracle's plus Gaussian noise (and a
    bias on the runner-up): free run greedy over its own lists, teacher-forced with its own
    lists through every prompt that diverged, as `gate run` records it."""
    rng = np.random.default_rng(seed)
    # The reference's own draws (a second stream: the oracle's and candidate's stay as they were).
    ref_rng = np.random.default_rng([seed, 1])
    o_recs, c_recs = [], []
    for p in range(PROMPTS):
        o_logits = [rng.normal(0, 3, VOCAB) for _ in range(LENGTH)]
        o_tops = [_top(x) for x in o_logits]
        o_ids = tuple(_argmax(t) for t in o_tops)
        o_recs.append(
            PromptRecord(
                id=f"p{p}",
                prompt_token_ids=PROMPT,
                token_ids=o_ids,
                top_logprobs=o_tops,
                extra={
                    "token_logits": [20.0] * LENGTH,
                    "reference_top_logprobs": [_top(x - ref_rng.normal(0, REFERENCE_NOISE, VOCAB)) for x in o_logits],
                },
            )
        )

        def cand_at(i: int, x: np.ndarray) -> np.ndarray:
            y = x + rng.normal(0, noise, VOCAB)
            y[int(np.argsort(-x)[1])] += bias
            return y

        forced_tops = [_top(cand_at(i, x)) for i, x in enumerate(o_logits)]
        forced_ids = tuple(_argmax(t) for t in forced_tops)
        free_tops, free_ids = [], []
        diverged = False
        for i in range(LENGTH):
            # Up to its first divergence the free run saw the oracle's context; after it, another.
            t = forced_tops[i] if not diverged else _top(rng.normal(0, 3, VOCAB))
            free_tops.append(t)
            free_ids.append(_argmax(t))
            diverged = diverged or free_ids[-1] != o_ids[i]
        extra: dict[str, Any] = {"token_logits": [20.0] * LENGTH}
        forced = None
        if diverged:
            forced = forced_ids
            extra.update({"forced_top_logprobs": forced_tops, "forced_mode": "decode"})
        c_recs.append(
            PromptRecord(
                id=f"p{p}",
                prompt_token_ids=PROMPT,
                token_ids=tuple(free_ids),
                top_logprobs=free_tops,
                forced_token_ids=forced,
                extra=extra,
            )
        )
    engine = {"name": "e", "version": "1"}
    oracle = Trace(TraceHeader("oracle", "m", TOP_K, engine, {"dtype": "bfloat16"}), tuple(o_recs), "oracle.jsonl")
    cand = Trace(TraceHeader("candidate", "m", TOP_K, engine, {"note": "x"}), tuple(c_recs), "candidate.jsonl")
    return oracle, cand
