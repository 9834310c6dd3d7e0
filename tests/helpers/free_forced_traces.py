"""A candidate whose free run and forced decode disagree (generated, pure: no torch): the
oracle's tokens, its free-run lists the oracle's colder, its forced lists warmer; and a floor
each side passes against the oracle, so that what fails it is the disagreement."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from gate.core.traces.trace import Trace
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.floor import Floor
from helpers.generated_traces import build


def _tempered(top: Any, scale: float) -> list[list[Any]]:
    """The list at another temperature (logprobs x scale, renormalised over the list): the
    same order, so the same greedy choice, another distribution."""
    lps = [float(lp) * scale for _, lp in top]
    m = max(lps)
    lse = m + math.log(math.fsum(math.exp(x - m) for x in lps))
    return [[int(t), x - lse] for (t, _), x in zip(top, lps, strict=True)]


def two_minded(seed: int = 3, spread: float = 0.25) -> tuple[Trace, Trace]:
    """An oracle, and a candidate with the oracle's tokens whose free run is the oracle's
    lists colder and whose forced decode is them warmer (every prompt forced): each close to
    the oracle, further from each other."""
    oracle, _ = build(seed=seed, noise=0.0)
    recs = []
    for o in oracle.records:
        tops = o.top_logprobs or ()
        recs.append(
            replace(
                o,
                top_logprobs=[_tempered(t, 1.0 + spread) for t in tops],
                forced_token_ids=o.token_ids,
                forced_top_logprobs=[_tempered(t, 1.0 - spread) for t in tops],
                forced_mode="prefill",
            )
        )
    return oracle, Trace(replace(oracle.header, role="candidate"), tuple(recs), "candidate.jsonl")


def floor_between(oracle: Trace, cand: Trace) -> Doctrine:
    """A floor the two lists each pass against the oracle (20% above the worse of them),
    with margin 1: what is left to fail the run is its disagreement with itself."""
    loose = compare(oracle, cand, Doctrine(floor=Floor(1e4, 1e5, 0.01, 1.0, "measuring"))).distribution
    assert loose is not None
    f = loose.overall
    assert f.kl_mean_mnats is not None and f.kl_p99_mnats is not None and f.same_top_rate is not None
    floor = Floor(1.2 * f.kl_mean_mnats, 1.2 * f.kl_p99_mnats, 0.5, 1.0, "between")
    return Doctrine(floor=floor)
