"""How every report words MoE routing (docs/guides/moe-routing.md): one line per routing flip, one
line for the run. Pure: strings from the core's records."""

from __future__ import annotations

from gate.core.traces.moe import SCORE_LOGPROB, RoutingFlip, RoutingSummary
from gate.reports._common import CLASS_LABELS, fmt_mnats


def flip_line(flip: RoutingFlip) -> str:
    """`routing flip at layer 1, token 4 (prompt): expert 1 vs 2, router gap 0.0 mnats (exact tie, higher_id)`."""
    where = f"generated position {flip.position}" if flip.position is not None else "prompt"
    unit = "mnats" if flip.score == SCORE_LOGPROB else "milli-score"
    if flip.router_gap_mnats is not None:
        gap = f"router gap {fmt_mnats(flip.router_gap_mnats)} {unit}"
    elif flip.gap_lower_bound_mnats is not None:
        gap = (
            f"router gap ≥ {fmt_mnats(flip.gap_lower_bound_mnats)} {unit} (oracle's expert outside the recorded scores)"
        )
    else:
        gap = "router gap unknown (no router scores)"
    cls = CLASS_LABELS.get(flip.cls, flip.cls)
    if flip.tie_break is not None:
        cls = f"{cls}, {flip.tie_break}"
    return (
        f"routing flip at layer {flip.layer}, token {flip.token_index} ({where}): "
        f"expert {flip.oracle_expert} vs {flip.candidate_expert}, {gap} ({cls})"
    )


def summary_line(summary: RoutingSummary) -> str:
    """One line: how many divergences a routing flip explains, or, under replay, how many remain."""
    n = summary.divergences
    if summary.replayed:
        line = (
            f"routing: replayed from the oracle; {n} divergence{'s' if n != 1 else ''} remain"
            f"{'s' if n == 1 else ''} (in the experts or attention, not the router)"
        )
        if summary.router_disagreements:
            line += (
                f"; the candidate's own router would have chosen other experts at {summary.router_disagreements} steps"
            )
        return line
    parts = []
    for count, label in (
        (summary.exact_ties, "exact tie"),
        (summary.near_ties, "near tie"),
        (summary.defects, "defect"),
    ):
        if count:
            parts.append(f"{count} {label}{'s' if count != 1 else ''}")
    line = f"routing: {summary.routing_caused} of {n} divergence{'s' if n != 1 else ''} follow a routing flip"
    if parts:
        line += f" ({', '.join(parts)} in the router)"
    if summary.without_routing_data:
        line += f"; {summary.without_routing_data} without routing data"
    return line
