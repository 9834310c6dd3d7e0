"""`gate run` as one request: its options collected once (`RunRequest`), checked, and carried
out against the pin, either by running a candidate engine (`gate.workflows.run.core.gate_run`)
or by adjudicating a trace the candidate wrote itself (`--candidate-trace`).

No printing: what the person should read goes to `say`, the progress to `display`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from gate.core.pins.pin import Pin, doctrine_for, load_pin
from gate.core.traces.reader import read_trace
from gate.core.traces.shards import parse_shard
from gate.core.traces.trace import write_trace
from gate.core.verdict.doctrine import Doctrine
from gate.errors import InputError
from gate.workflows.common.engine_calls import open_engine
from gate.workflows.common.progress import PROGRESS_SUFFIX, check_progress_target, default_progress_path
from gate.workflows.common.requests import (
    DoctrineFlags,
    EngineRequest,
    ProgressDisplay,
    Say,
    default_model,
    no_progress,
    silent,
)
from gate.workflows.run.core import RunOutcome, RunPlan, Timings, gate_run, gate_trace_against_pin


@dataclass(frozen=True, slots=True)
class RunRequest:
    """Everything `gate run` was asked, option for option."""

    model: str | None = None
    engine: EngineRequest = field(default_factory=EngineRequest)
    doctrine: DoctrineFlags = field(default_factory=DoctrineFlags)
    strict: bool = False
    candidate_trace: Path | None = None
    save_trace: Path | None = None
    pins_dir: Path | None = None
    force: bool = False
    shard: str | None = None
    resume: bool = False
    progress_file: Path | None = None
    timeout: float | None = None
    repeat: int = 1

    def pin_model(self) -> str:
        """The model whose pin judges the run, a candidate trace's too."""
        return self.model or default_model()

    def check(self) -> None:
        """What can be refused from the options alone: the engine options, the doctrine
        flags (a bad threshold fails before any work)."""
        self.engine.options()
        self.doctrine.check()


def run_gate(request: RunRequest, *, say: Say = silent, display: ProgressDisplay = no_progress) -> RunOutcome:
    """The run `request` asks for; the candidate trace written where `--save-trace` says."""
    opts = request.engine.options()
    flags = request.doctrine.check()
    if request.candidate_trace is not None:
        _refuse_with_candidate_trace(request, opts)
        cand = read_trace(request.candidate_trace, role="candidate")
        # The pin is the one asked for (--model, else the default model), never the one the
        # trace names: a trace for another model is refused (exit 2) by the provenance check.
        pin = load_pin(request.pin_model(), request.pins_dir)
        return gate_trace_against_pin(pin, cand, doctrine_for(pin, flags, strict=request.strict))
    pin = load_pin(request.pin_model(), request.pins_dir)
    doctrine = doctrine_for(pin, flags, strict=request.strict)
    name = request.engine.name()
    plan = _run_plan(request, pin, name, opts, say)
    outcome = _run_engine(request, pin, name, opts, doctrine, plan, say, display)
    if request.save_trace is not None:
        write_trace(request.save_trace, outcome.candidate, overwrite=request.force)
        say(f"candidate trace written to {request.save_trace}")
    return outcome


def _refuse_with_candidate_trace(request: RunRequest, opts: dict[str, str]) -> None:
    given = [
        flag
        for flag, v in (
            ("--engine", request.engine.engine),
            ("--engine-opt", opts),
            ("--model-path", request.engine.model_path),
            ("--save-trace", request.save_trace),
            ("--shard", request.shard),
            ("--resume", request.resume),
            ("--progress-file", request.progress_file),
            ("--timeout", request.timeout),
            ("--repeat", request.repeat != 1),
        )
        if v
    ]
    if given:
        raise InputError(f"--candidate-trace adjudicates a trace as it is: {', '.join(given)} cannot go with it")


def _run_plan(request: RunRequest, pin: Pin, engine_name: str, opts: dict[str, str], say: Say) -> RunPlan:
    """The options of a long run, checked before the engine loads."""
    kn = parse_shard(request.shard) if request.shard is not None else None
    timeout, repeat, save_trace = request.timeout, request.repeat, request.save_trace
    if timeout is not None and not timeout > 0:
        raise InputError(f"--timeout {timeout}: must be a positive number of seconds")
    if repeat < 1:
        raise InputError(f"--repeat {repeat}: must be at least 1")
    progress_file = request.progress_file
    optional = progress_file is None and save_trace is None and not request.resume
    if progress_file is None:
        if save_trace is not None:
            progress_file = save_trace.with_name(save_trace.name + PROGRESS_SUFFIX)
        else:
            progress_file = default_progress_path(pin.model, engine_name, kn)
    if not request.resume and progress_file.exists():
        # Before the engine loads: only a progress file of this model's runs is ever replaced.
        check_progress_target(progress_file, pin.model)
        say(f"replacing the progress file of an earlier run, {progress_file} (--resume continues one)")
    return RunPlan(
        engine_options=opts,
        shard=kn,
        progress_path=progress_file,
        resume=request.resume,
        timeout=timeout,
        repeat=repeat,
        progress_optional=optional,
    )


def _run_engine(
    request: RunRequest,
    pin: Pin,
    name: str,
    opts: dict[str, str],
    doctrine: Doctrine,
    plan: RunPlan,
    say: Say,
    display: ProgressDisplay,
) -> RunOutcome:
    """The candidate engine loaded, run over the pin and closed. Ctrl-C raises
    `RunInterrupted` with the report of the prompts done so far."""
    timings = Timings()
    start = time.perf_counter()
    notes: list[str] = []
    try:
        with open_engine(request.engine.loader(pin, opts, name), name) as engine:
            timings.load_s = time.perf_counter() - start
            with display() as progress:
                return gate_run(engine, pin, doctrine, plan, progress=progress, timings=timings, notes=notes)
    finally:
        for note in notes:
            say(note)
