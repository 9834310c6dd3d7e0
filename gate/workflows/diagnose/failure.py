"""What a failed gate run points `gate diagnose` to: the position to diagnose (its first
defect; when its distribution alone failed it, the position of its largest KL; else its
first divergence) and, in words, the figures that failed it (`GateFailure`), so that a
diagnosis that locates nothing still says what failed and through which path."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from gate.core.diagnosis.capture import DECODE
from gate.core.diagnosis.record import GateFailure
from gate.core.traces.trace import Trace
from gate.core.verdict.distribution import Point as DistributionPoint
from gate.core.verdict.distribution import points as distribution_points
from gate.core.verdict.result import DEFECT, FAIL, GateResult
from gate.text import plural
from gate.workflows.diagnose.core import Target, target_given, target_of_result

if TYPE_CHECKING:
    from gate.core.pins.pin import Pin

DISTRIBUTION = "distribution"  # the source of the position of a failed distribution's largest KL


def failure_of(pin: Pin, result: GateResult, candidate: Trace) -> tuple[Target | None, GateFailure | None]:
    """The position a failed gate points to, and why it failed: its first defect; else, when
    its distribution alone failed it, the position of its largest KL (the figure that failed
    it, at its largest); else its first divergence. (None, None) for a passing gate that
    nothing diverged in; a passing gate's first divergence comes with no failure."""
    failed = result.verdict == FAIL
    reasons = failure_reasons(result) if failed else ()
    target = target_of_result(pin, result)
    by_distribution = result.distribution is not None and (result.distribution.beyond or result.distribution.disagrees)
    if failed and by_distribution and (target is None or target.divergence_class != DEFECT):
        worst = largest_kl(pin, result, candidate)
        if worst is not None:
            t = target_given(pin, worst.prompt_id, worst.position, DECODE)
            chosen = f"the position of its largest KL, {worst.kl_mnats:.3f} mnats"
            target = replace(t, source=DISTRIBUTION)
            return target, GateFailure(reasons, chosen, target.path)
    if target is None or not failed:
        return target, None
    cls = (target.divergence_class or "divergence").replace("_", " ")
    chosen = "its first defect" if target.divergence_class == DEFECT else f"its first divergence, a {cls}"
    return target, GateFailure(reasons, chosen, target.path)


def failure_reasons(result: GateResult) -> tuple[str, ...]:
    """Each figure that failed the gate, in words."""
    out: list[str] = []
    defects = result.counts["defects"]
    if defects:
        out.append(plural(defects, "defect"))
    dist = result.distribution
    if dist is not None and dist.beyond:
        out.append(f"its distribution is beyond the honest floor: {', '.join(dist.beyond_figures)}")
    if dist is not None and dist.insufficient:
        out.append(f"its distribution could not be judged: {dist.not_judged_reason}")
    if dist is not None and dist.disagrees:
        out.append("its free-run and forced lists disagree beyond the honest floor")
    if not out:
        unratified = sum(not p.ratified for p in result.prompts)
        out.append(f"{plural(unratified, 'prompt')} not ratified")
    return tuple(out)


def largest_kl(pin: Pin, result: GateResult, candidate: Trace) -> DistributionPoint | None:
    """The position where the candidate's list is farthest from the oracle's (KL), if any."""
    outcomes = {p.id: p.outcomes for p in result.prompts}
    pts = [p for p in distribution_points(pin.trace, candidate, outcomes) if math.isfinite(p.kl_mnats)]
    order = {r.id: i for i, r in enumerate(pin.trace.records)}
    return min(pts, key=lambda p: (-p.kl_mnats, order.get(p.prompt_id, 1 << 30), p.position), default=None)
