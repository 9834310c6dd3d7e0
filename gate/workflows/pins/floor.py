"""Measuring a pin's honest floor where it is recorded (`gate pin record`).

A pin for a new model has no doctrine study behind it. What `gate pin record` can run
where it records are honest re-runs of the same model: the oracle engine again, one
prompt at a time instead of all in one batch (another batch composition, the schedule
honest servers vary), and, where the model loads in transformers, the HF engine on the
same device (another implementation of the same weights). Each is gated against the pin
just recorded (free run, teacher-forced with its top-k where it diverged), and the floor
is their worst distribution figures (`gate.core.verdict.distribution`): the largest mean
and p99 KL, the lowest same-top rate. The floor says which re-runs measured it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gate.core.engine import Engine, PromptInput
from gate.core.pins.suite import Suite
from gate.core.traces.trace import PromptRecord, Trace, TraceHeader
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.distribution import MIN_POSITIONS, Figures
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.floor import Floor
from gate.workflows.common.engine_calls import engine_call, force_along, generate

# The factor a run may exceed a floor measured here by. Wider than the default pin's 1.2
# (docs/studies/doctrine-study.md: 12 honest variants on three machine kinds): two re-runs on
# one machine see less of the honest spread (docs/reference/doctrine.md).
DEFAULT_MARGIN = 1.5


@dataclass(frozen=True, slots=True)
class HonestRerun:
    """One honest re-run gated against the new pin, and its distribution figures."""

    name: str
    figures: Figures

    def line(self) -> str:
        f = self.figures
        if not f.positions:
            return f"{self.name}: no positions measured"
        return (
            f"{self.name}: {f.positions} positions, mean KL {f.kl_mean_mnats:.3f} mnats, p99 KL "
            f"{f.kl_p99_mnats:.3f} mnats, same top {100 * (f.same_top_rate or 0.0):.2f}%"
        )


def prompts_of(pin: Trace, suite: Suite) -> list[PromptInput]:
    by_id = suite.by_id()
    out = []
    for rec in pin.records:
        max_tokens = by_id[rec.id].max_tokens
        assert max_tokens is not None  # the caller resolves the suite
        out.append(PromptInput(id=rec.id, prompt_token_ids=rec.prompt_token_ids, max_tokens=max_tokens))
    return out


def rerun_against(
    engine: Engine, pin: Trace, prompts: Sequence[PromptInput], *, name: str, one_at_a_time: bool
) -> HonestRerun:
    """`engine` over the pin's prompts (one call per prompt, or all in one), teacher-forced
    where it diverged, gated against `pin` by its distribution."""
    top_k = pin.header.top_k
    records: list[PromptRecord] = []
    if one_at_a_time:
        for p in prompts:
            records.extend(generate(engine, [p], top_k))
    else:
        records = list(generate(engine, prompts, top_k))
    info = engine_call(engine, "info", engine.info)
    header = TraceHeader(
        role="candidate",
        model=pin.header.model,
        top_k=top_k,
        engine={"name": str(info.get("name", name)), "version": "-"},
    )
    free = Trace(header=header, records=tuple(records), path=f"<{name}>")
    cand, _ = force_along(engine, pin, free, top_k=top_k, skip_unavailable=True)
    result = compare(pin, cand, Doctrine())
    assert result.distribution is not None  # compare always measures it
    return HonestRerun(name=name, figures=result.distribution.overall)


def floor_from(reruns: Sequence[HonestRerun], *, where: str, margin: float = DEFAULT_MARGIN) -> Floor | None:
    """The floor the re-runs measure (None: too few positions, or no honest difference at
    all: a floor of 0 would fail every engine that is not the oracle bit for bit)."""
    usable = [r for r in reruns if r.figures.positions >= MIN_POSITIONS]
    if not usable:
        return None
    kl_mean = max(r.figures.kl_mean_mnats or 0.0 for r in usable)
    kl_p99 = max(r.figures.kl_p99_mnats or 0.0 for r in usable)
    # A re-run with no miss at all measures the miss rate only as below one in its positions.
    same = min(min(r.figures.same_top_rate or 0.0, 1.0 - 1.0 / r.figures.positions) for r in usable)
    if kl_mean <= 0.0 or kl_p99 <= 0.0:
        return None
    measured_by = f"gate pin record on {where}, honest re-runs against the new pin: " + "; ".join(
        r.line() for r in reruns
    )
    return Floor(kl_mean, kl_p99, same, margin, measured_by)


def with_floor(trace: Trace, doctrine: Mapping[str, Any], floor: Floor) -> tuple[Trace, dict[str, Any]]:
    """The pin trace with `floor` in its header's doctrine, and that doctrine (for oracle.json)."""
    own = {**dict(doctrine), "floor": floor.to_dict()}
    header = replace(trace.header, extra={**trace.header.extra, "doctrine": own})
    return replace(trace, header=header), own


def oracle_rerun(oracle: Engine, pin: Trace, suite: Suite) -> HonestRerun:
    """The oracle engine again over the pin's prompts, one prompt at a time (the pin: all in one batch)."""
    name = engine_call(oracle, "info", oracle.info).get("name", "oracle")
    return rerun_against(
        oracle, pin, prompts_of(pin, suite), name=f"{name} one prompt at a time vs batched", one_at_a_time=True
    )


def engine_rerun(load: Callable[[], Engine], pin: Trace, suite: Suite, *, name: str) -> HonestRerun:
    """Another honest engine (`load` builds it, e.g. the HF engine on the same device) against the pin."""
    engine = load()
    try:
        return rerun_against(engine, pin, prompts_of(pin, suite), name=name, one_at_a_time=False)
    finally:
        engine.close()
