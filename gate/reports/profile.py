"""The divergence profile: how often, where and by how much a candidate leaves the oracle.

A quantised build (llama.cpp Q4_1, ONNX int4) is never token-exact with its bf16 source;
"fail" alone does not tell its shipper whether it is off by a hair at coin-flip positions or
confidently wrong. This section answers, from the adjudicated divergences alone:

- how often: divergent positions among all oracle positions (forced data adjudicates every
  position, so this is a per-token rate), and how many prompts run token-exact to the end;
- where: how far the prompts that diverge run token-exact first (their first divergence);
- by how much: the oracle's own margin there (`top2_gap_mnats`: was the oracle itself
  nearly undecided?) and the candidate's cost in the oracle's eyes
  (`oracle_minus_candidate_mnats`), in bands: exact and near ties as the verdict classed
  them (the doctrine's mnats or grid steps), other gaps up to 1 nat, beyond; and the
  candidate token's rank in the oracle's list.

Pure: a `GateResult` in, a frozen record out; `profile_lines` renders it as plain text for
the terminal and Markdown reports.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gate.core.verdict.result import EXACT_TIE, NEAR_TIE, GateResult
from gate.text import plural

NAT_MNATS = 1000.0


@dataclass(frozen=True, slots=True)
class Spread:
    """Median, 90th percentile and maximum of some mnats (or positions)."""

    n: int
    median: float
    p90: float
    max: float

    @staticmethod
    def of(values: Sequence[float]) -> Spread | None:
        if not values:
            return None
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, int(0.9 * (len(ordered) - 1) + 0.5))]
        return Spread(len(ordered), float(statistics.median(ordered)), float(p90), float(ordered[-1]))

    def to_dict(self) -> dict[str, float | int]:
        return {"n": self.n, "median": self.median, "p90": self.p90, "max": self.max}


@dataclass(frozen=True, slots=True)
class DivergenceProfile:
    positions: int
    divergent_positions: int
    prompts: int
    prompts_token_exact: int
    first_divergence: Spread | None
    oracle_margin_mnats: Spread | None  # the oracle's top-2 gap where the candidate diverged
    cost_mnats: Spread | None  # oracle − candidate, where the candidate token is in the oracle's list
    bands: dict[str, int]  # exact_tie, near_tie, up_to_1_nat, over_1_nat, outside_top_k, stopped
    ranks: dict[str, int]  # "2", "3", "4+", "outside"

    @property
    def rate(self) -> float:
        return self.divergent_positions / self.positions if self.positions else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "positions": self.positions,
            "divergent_positions": self.divergent_positions,
            "divergence_rate": self.rate,
            "prompts": self.prompts,
            "prompts_token_exact": self.prompts_token_exact,
            "first_divergence_position": self.first_divergence.to_dict() if self.first_divergence else None,
            "oracle_top2_gap_mnats": self.oracle_margin_mnats.to_dict() if self.oracle_margin_mnats else None,
            "oracle_minus_candidate_mnats": self.cost_mnats.to_dict() if self.cost_mnats else None,
            "bands": dict(self.bands),
            "candidate_ranks": dict(self.ranks),
        }


def divergence_profile(result: GateResult) -> DivergenceProfile:
    divs = result.divergences
    bands = dict.fromkeys(("exact_tie", "near_tie", "up_to_1_nat", "over_1_nat", "outside_top_k", "stopped"), 0)
    ranks = dict.fromkeys(("2", "3", "4+", "outside"), 0)
    costs: list[float] = []
    for d in divs:
        if d.candidate_token is None:
            bands["stopped"] += 1
            continue
        cost = d.oracle_minus_candidate_mnats
        if cost is None:
            bands["outside_top_k"] += 1
            ranks["outside"] += 1
            continue
        costs.append(cost)
        # Ties as the verdict counted them (the doctrine may ratify by grid steps too).
        if d.cls == EXACT_TIE:
            bands["exact_tie"] += 1
        elif d.cls == NEAR_TIE:
            bands["near_tie"] += 1
        elif cost <= NAT_MNATS:
            bands["up_to_1_nat"] += 1
        else:
            bands["over_1_nat"] += 1
        rank = d.candidate_rank or 0
        ranks["2" if rank <= 2 else "3" if rank == 3 else "4+"] += 1
    firsts = [float(p.first_divergence) for p in result.prompts if p.first_divergence is not None]
    margins = [d.top2_gap_mnats for d in divs if d.top2_gap_mnats is not None]
    return DivergenceProfile(
        positions=result.counts["positions"],
        divergent_positions=len({(d.prompt_id, d.position) for d in divs}),
        prompts=len(result.prompts),
        prompts_token_exact=sum(p.strict for p in result.prompts),
        first_divergence=Spread.of(firsts),
        oracle_margin_mnats=Spread.of(margins),
        cost_mnats=Spread.of(costs),
        bands=bands,
        ranks=ranks,
    )


def _mn(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 10 else f"{x:.2g}"


def profile_lines(result: GateResult) -> list[str]:
    """The profile in a few plain sentences; empty when nothing diverged."""
    if not result.divergences:
        return []
    p = divergence_profile(result)
    near = result.doctrine.near_tie_mnats
    one_in = f", 1 in {round(1 / p.rate):,}" if p.rate else ""
    lines = [
        f"Divergence profile: {p.divergent_positions:,} of {p.positions:,} positions diverge "
        f"({100 * p.rate:.1f}%{one_in}); {p.prompts_token_exact} of {p.prompts} prompts token-exact to the end."
    ]
    if p.first_divergence is not None:
        f = p.first_divergence
        who = "the one prompt that diverges runs" if f.n == 1 else f"the {f.n} prompts that diverge run"
        their = "its" if f.n == 1 else "their"
        lines.append(
            f"Where: {who} token-exact for {f.median:g} tokens (median; "
            f"90th percentile {f.p90:g}, longest {f.max:g}) before {their} first divergence."
        )
    if p.oracle_margin_mnats is not None:
        m = p.oracle_margin_mnats
        lines.append(
            f"The oracle's own margin there (top-2 gap): median {_mn(m.median)} mnats, "
            f"90th percentile {_mn(m.p90)}, largest {_mn(m.max)}."
        )
    b = p.bands
    cost = ""
    if p.cost_mnats is not None:
        c = p.cost_mnats
        cost = f"; median {_mn(c.median)} mnats, 90th percentile {_mn(c.p90)}, largest {_mn(c.max)}"
    lines.append(
        f"By how much (oracle − candidate logprob): {plural(b['exact_tie'], 'exact tie')}, "
        f"{plural(b['near_tie'], 'near tie')}, {b['up_to_1_nat']} other gaps up to 1 nat, "
        f"{b['over_1_nat']} over 1 nat, {b['outside_top_k']} outside the oracle's top-k"
        + (f", {b['stopped']} where the candidate stopped" if b["stopped"] else "")
        + cost
        + "."
    )
    lines.append(near_tie_sentence(result, near))
    r = p.ranks
    lines.append(
        f"The candidate's token was the oracle's #2 at {plural(r['2'], 'position')}, #3 at {r['3']}, "
        f"#4 or lower at {r['4+']}, outside its top-k at {r['outside']}."
    )
    return lines


def near_tie_sentence(result: GateResult, near_mnats: float) -> str:
    """What the doctrine counts as a near tie, one unit to a clause: mnats, then grid steps,
    then the evidence rule's limits (each in grid steps)."""
    doctrine = result.doctrine
    grid = f"steps of the {doctrine.dtype or 'bfloat16'} grid"
    out = f"A near tie is a gap of at most {_mn(near_mnats)} mnats"
    if doctrine.near_tie_ulps is not None:
        out += f", or of at most {doctrine.near_tie_ulps:g} {grid}"
    ev = doctrine.evidence
    if ev is not None:
        out += (
            f"; or one the evidence rule ratifies: an oracle gap of at most {ev.oracle_ulps:g} {grid}, with the "
            f"candidate's own margin at most {ev.candidate_ulps:g} and its drift at most {ev.drift_ulps:g}"
        )
    return out + "."
