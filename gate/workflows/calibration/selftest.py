"""Self-test by mutation, the run: the unmutated engine records a reference, then every
mutation runs over the pinned prompts and is judged against the reference and the pin
(see `gate.core.calibration.selftest` for the judging). `gate selftest` is one `SelftestRequest`."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gate.core.calibration.selftest import (
    SELFTEST_NEAR_TIE_ULPS,
    MutantOutcome,
    Mutation,
    SelfTestResult,
    Verdict,
    changed_positions,
    judge,
    reference_trace,
    reported_positions,
)
from gate.core.engine import Engine
from gate.core.pins.diff import exact_top2_ties
from gate.core.pins.pin import Pin, doctrine_for, load_pin
from gate.core.traces.trace import PromptRecord, Trace
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.doctrine import Doctrine
from gate.workflows.common.engine_calls import engine_call, force_along, open_engine
from gate.workflows.common.progress import QUIET, Progress
from gate.workflows.common.requests import (
    DoctrineFlags,
    ProgressDisplay,
    Say,
    default_model,
    no_progress,
    parse_engine_opts,
    silent,
)
from gate.workflows.run.core import run_candidate


def _forced(
    engine: Engine,
    oracle: Trace,
    free: Trace,
    progress: Progress,
    *,
    known: Mapping[str, PromptRecord] | None = None,
) -> Trace:
    # The top-k at each forced position too: the evidence doctrine weighs the mutant's own
    # margin at a flip and its drift (a softmax per step, small beside the forward pass).
    return force_along(engine, oracle, free, top_k=oracle.header.top_k, known=known, progress=progress)[0]


def _same_tokens(reference: Trace, pin: Trace, forced: Trace) -> dict[str, PromptRecord]:
    """The records of `forced` (forced along the reference) usable against the pin: those of
    prompts where the reference and the pin have the same tokens."""
    ref = reference.by_id()
    done = forced.by_id()
    return {r.id: done[r.id] for r in pin.records if r.id in ref and ref[r.id].token_ids == r.token_ids}


def run_selftest(
    pin: Pin,
    baseline: Callable[[], Engine],
    mutations: Sequence[Mutation],
    doctrine: Doctrine,
    *,
    progress: Progress | None = None,
    on_mutant: Callable[[str], None] | None = None,
) -> SelfTestResult:
    """Run the unmutated engine, then every mutation, over `pin`'s prompts and judge them."""
    start = time.perf_counter()
    progress = progress or QUIET
    announce = on_mutant or (lambda _name: None)

    announce("reference")
    with open_engine(baseline, "baseline") as engine:
        info = engine_call(engine, "info", engine.info)
        base_free = run_candidate(engine, pin, progress=progress, info=info)
        reference = reference_trace(base_free)
        base_forced = _forced(engine, pin.trace, base_free, progress)
    baseline_vs_pin = compare(pin.trace, base_forced, doctrine)

    outcomes: list[MutantOutcome] = []
    for m in mutations:
        announce(m.name)
        t0 = time.perf_counter()
        with open_engine(m.load, m.name) as engine:
            free = run_candidate(engine, pin, progress=progress)
            vs_ref = _forced(engine, reference, free, progress)
            known = _same_tokens(reference, pin.trace, vs_ref)
            vs_pin = _forced(engine, pin.trace, free, progress, known=known)
        r_ref = compare(reference, vs_ref, doctrine)
        r_pin = compare(pin.trace, vs_pin, doctrine)
        prompts, changed = changed_positions(reference, vs_ref)
        status, met, why = judge(m.expect, changed, r_ref)
        outcomes.append(
            MutantOutcome(
                name=m.name,
                description=m.description,
                expect=m.expect,
                status=status,
                met=met,
                why=why,
                changed_prompts=prompts,
                changed_positions=changed,
                reported_positions=reported_positions(r_ref),
                against_reference=Verdict.of(r_ref),
                against_pin=Verdict.of(r_pin),
                seconds=time.perf_counter() - t0,
                reference_result=r_ref,
                pin_result=r_pin,
                candidate=vs_ref,
            )
        )
    return SelfTestResult(
        model=pin.model,
        engine=f"{info.get('name', 'engine')} {info.get('version', '')}".strip(),
        doctrine=doctrine,
        prompts=len(reference.records),
        positions=sum(len(r.token_ids) for r in reference.records),
        reference_exact_ties=len(exact_top2_ties(reference)),
        baseline_against_pin=Verdict.of(baseline_vs_pin),
        mutants=tuple(outcomes),
        seconds=time.perf_counter() - start,
        reference=reference,
    )


@dataclass(frozen=True, slots=True)
class SelftestRequest:
    """Everything `gate selftest` was asked: the model whose pin is run, the HF engine's
    weights and options, the mutants to run (all by default) and the doctrine flags."""

    model: str | None = None
    model_path: Path | None = None
    pins_dir: Path | None = None
    engine_opts: tuple[str, ...] = ()
    only: tuple[str, ...] | None = None
    doctrine: DoctrineFlags = field(default_factory=DoctrineFlags)

    def pin_model(self) -> str:
        return self.model or default_model()


def selftest_request(
    request: SelftestRequest, *, say: Say = silent, display: ProgressDisplay = no_progress
) -> SelfTestResult:
    from gate.engines.registry import mutants

    opts = parse_engine_opts(request.engine_opts)
    pin = load_pin(request.pin_model(), request.pins_dir)
    # The pin's own doctrine, as `gate run` applies it, with the flags' fields changed: the
    # self-test checks that verdict. A pin without one is judged with one grid step besides
    # the default mnats (`SELFTEST_NEAR_TIE_ULPS`: the one-step fault must come out ratified).
    doctrine = doctrine_for(pin, request.doctrine.overrides(), defaults={"near_tie_ulps": SELFTEST_NEAR_TIE_ULPS})
    weights = str(request.model_path) if request.model_path is not None else pin.model
    built = mutants()
    chosen = built.mutations(weights, opts, only=list(request.only) if request.only is not None else None)
    with display() as progress:
        return run_selftest(
            pin,
            built.baseline_loader(weights, opts),
            chosen,
            doctrine,
            progress=progress,
            on_mutant=lambda name: say(f"selftest: running {name}"),
        )
