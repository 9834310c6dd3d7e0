"""Does the candidate agree with itself? Its free-run and forced lists at the contexts both saw.

A candidate traced by `gate run` reports two lists at the positions of a diverged prompt up
to and including its first divergence (`gate.core.verdict.coverage.free_context`): the
free run's (`top_logprobs`, its decode path on its own tokens, which are the oracle's there)
and the forced decode's (`forced_top_logprobs`, the oracle's tokens fed). Both are the
candidate's distribution over the same context. An honest engine computes the same model
both times: the HF engine forces through its KV cache exactly as it generates (the two
lists are the same numbers), an HTTP engine forces by prefill and differs by kernel
rounding, less than an honest engine differs from the oracle. A build whose two paths
compute different models (a lossy cache its prefill does not use, a decode-path bug) shows
here even where each path alone sits near the oracle.

At each shared position: the larger of KL(free || forced) and KL(forced || free), each over
the first list's entries with the second's absent tokens charged as the distribution
verdict charges them (`gate.core.verdict.kl.kl_mnats`), in mnats. With the pin's
honest `Floor`, a run whose mean or p99 of these is beyond the floor's limit (the same
limits as against the oracle: two honest computations of one model differ by no more than
an honest engine and the oracle do) fails by its own rule, `RULE_FREE_FORCED`.

Pure: no I/O, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gate.core.traces.trace import Trace
from gate.core.verdict.coverage import free_context, needed
from gate.core.verdict.floor import Floor
from gate.core.verdict.kl import canonical, kl_mnats
from gate.core.verdict.own_lists import FORCED, FREE_RUN, CandidateEvidence

# The rule a run fails by when its free-run and forced lists disagree beyond the floor.
RULE_FREE_FORCED = "distribution_free_forced_disagree"
FREE_FORCED_WHY = (
    "the candidate's free run and its forced decode disagree beyond honest drift at the contexts both saw "
    "(its decode path and its forced path compute different distributions)"
)


def _quantile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest rank (as `gate.core.verdict.distribution.quantile`)."""
    n = len(sorted_values)
    if not n:
        return None
    return float(sorted_values[min(n - 1, max(0, math.ceil(q * n) - 1))])


@dataclass(frozen=True, slots=True)
class FreeForced:
    """The KL between the candidate's own free-run and forced lists at the shared contexts.

    positions: how many positions carry both lists; prompts: in how many prompts;
    kl_*: mean, p99 (nearest rank), max of the symmetric-worst KL, in mnats (None: no
    position); beyond_figures: the figures beyond the floor's limits, in words."""

    positions: int = 0
    prompts: int = 0
    kl_mean_mnats: float | None = None
    kl_p99_mnats: float | None = None
    kl_max_mnats: float | None = None
    worst_prompt: str | None = None
    worst_position: int | None = None
    beyond_figures: tuple[str, ...] = ()

    def to_dict(self, floor: Floor | None, judged: bool) -> dict[str, Any]:
        disagree = judged and bool(self.beyond_figures)
        return {
            "positions": self.positions,
            "prompts": self.prompts,
            "kl_mnats": {"mean": self.kl_mean_mnats, "p99": self.kl_p99_mnats, "max": self.kl_max_mnats},
            "worst": (
                {"prompt_id": self.worst_prompt, "position": self.worst_position}
                if self.worst_prompt is not None
                else None
            ),
            "limits": (
                {"kl_mean_mnats": floor.kl_mean_limit, "kl_p99_mnats": floor.kl_p99_limit}
                if floor is not None
                else None
            ),
            "judged": judged,
            "disagree": disagree,
            "beyond_figures": list(self.beyond_figures) if judged else [],
            "rule": RULE_FREE_FORCED if disagree else None,
            "why": FREE_FORCED_WHY if disagree else None,
            "kl": "the larger of KL(free || forced) and KL(forced || free) at each position where the candidate "
            "reported both lists on the same context",
        }


def self_kl_mnats(a: Sequence[Sequence[Any]], b: Sequence[Sequence[Any]], keep: int) -> float:
    """The larger of the two directions' KL, each over the first list with the second's
    first `keep` entries (`distribution.kl_mnats`)."""
    ab, _ = kl_mnats(a, canonical(b, keep))
    ba, _ = kl_mnats(b, canonical(a, keep))
    return max(ab, ba)


def free_forced_of(oracle: Trace, candidate: Trace, evidence: CandidateEvidence, floor: Floor | None) -> FreeForced:
    """The run's free-run-versus-forced figures, and with a floor which are beyond it."""
    cand = candidate.by_id()
    top_k = oracle.header.top_k
    kls: list[float] = []
    prompts = 0
    worst: tuple[float, str, int] | None = None
    for o in oracle.records:
        c = cand.get(o.id)
        if c is None or o.top_logprobs is None or c.forced_token_ids is None:
            continue
        own = evidence.own(o.id)
        seen = False
        for i in free_context(o, c):
            free, forced = own.at(FREE_RUN, i), own.at(FORCED, i)
            if free is None or forced is None or i >= len(o.top_logprobs):
                continue
            kl = self_kl_mnats(free, forced, needed(o.top_logprobs[i], top_k))
            kls.append(kl)
            seen = True
            if worst is None or kl > worst[0]:
                worst = (kl, o.id, i)
        prompts += seen
    if not kls:
        return FreeForced()
    ordered = sorted(kls)
    mean = math.fsum(ordered) / len(ordered)
    p99 = _quantile(ordered, 0.99)
    return FreeForced(
        positions=len(ordered),
        prompts=prompts,
        kl_mean_mnats=mean,
        kl_p99_mnats=p99,
        kl_max_mnats=ordered[-1],
        worst_prompt=worst[1] if worst else None,
        worst_position=worst[2] if worst else None,
        beyond_figures=beyond(mean, p99, floor) if floor is not None else (),
    )


def beyond(mean: float, p99: float | None, floor: Floor) -> tuple[str, ...]:
    """The figures beyond the floor's limits, said with their numbers."""
    out: list[str] = []
    m = f"{floor.margin:g}"
    if mean > floor.kl_mean_limit:
        out.append(
            f"free-run vs forced mean KL {mean:.3f} mnats > {floor.kl_mean_limit:.3f} "
            f"(honest floor {floor.kl_mean_mnats:g} x margin {m})"
        )
    if p99 is not None and p99 > floor.kl_p99_limit:
        out.append(
            f"free-run vs forced p99 KL {p99:.3f} mnats > {floor.kl_p99_limit:.3f} "
            f"(honest floor {floor.kl_p99_mnats:g} x margin {m})"
        )
    return tuple(out)
