"""The run: one pipeline from a pin and an engine to a `GateResult`.

`gate run`, goldens, the self-test, calibration and `pin record` all drive engines
through it. In order:
1. plan: the candidate's tokenizer must reproduce the pinned prompt token ids, and its
   provenance (weights and tokenizer hashes) must match the pin's where both are known;
   a shard or a resumed run narrows the prompts;
2. free run: the candidate generates greedily over the pinned prompts, each finished
   record appended to the progress file (`--resume` continues from it); `--repeat N`
   runs it N times and stops with exit 3 when any token or logprob differs between
   repeats (an engine that is not deterministic cannot be gated token-exactly);
3. force: every prompt that diverged is teacher-forced through the oracle's tokens, so a
   tie early in a prompt cannot hide a defect later in it;
4. adjudicate: the core compares; divergent tokens get their decoded text for the report.

Ctrl-C during the free run raises `RunInterrupted` carrying the report of the prompts
done so far. No printing and no torch here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from gate.core.engine import Engine, PromptInput, ReplaysRouting
from gate.core.pins.pin import Pin
from gate.core.storage.files import display_path, portable
from gate.core.traces.machine import machine_meta
from gate.core.traces.shards import format_shard, select_shard
from gate.core.traces.trace import PromptRecord, Trace, TraceHeader
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.result import GateResult
from gate.core.verdict.routing import oracle_routing
from gate.core.verdict.run_record import Interruption, RunRecord
from gate.errors import EngineError, InputError, Interrupted
from gate.workflows.common.engine_calls import (
    batch_size_for,
    diverged_ids,
    engine_call,
    force_along,
    generate,
    late_info,
)
from gate.workflows.common.guard import GuardedEngine, vocab_size_of
from gate.workflows.common.progress import QUIET, Progress, ProgressLog
from gate.workflows.common.provenance import HASH_KEYS, check_prompt_tokens, check_provenance, model_hashes
from gate.workflows.run.judge import judge

# How many changed positions a nondeterminism message lists.
_SHOWN = 5


@dataclass(slots=True)
class Timings:
    """Wall time of each stage of a run, in seconds."""

    load_s: float = 0.0
    check_s: float = 0.0
    candidate_s: float = 0.0
    force_s: float = 0.0
    adjudicate_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.load_s + self.check_s + self.candidate_s + self.force_s + self.adjudicate_s

    def to_dict(self) -> dict[str, float]:
        return {
            "load_s": round(self.load_s, 3),
            "check_s": round(self.check_s, 3),
            "candidate_s": round(self.candidate_s, 3),
            "force_s": round(self.force_s, 3),
            "adjudicate_s": round(self.adjudicate_s, 3),
            "total_s": round(self.total_s, 3),
        }

    def line(self) -> str:
        return (
            f"timings: load {self.load_s:.2f}s, checks {self.check_s:.2f}s, candidate {self.candidate_s:.2f}s, "
            f"force {self.force_s:.2f}s, adjudication {self.adjudicate_s:.2f}s, total {self.total_s:.2f}s"
        )


@contextmanager
def timed(timings: Timings, stage: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        setattr(timings, stage, getattr(timings, stage) + time.perf_counter() - start)


@dataclass(frozen=True, slots=True)
class RunOutcome:
    result: GateResult
    candidate: Trace
    timings: Timings
    forced_prompts: tuple[str, ...] = ()


def prompt_inputs(pin: Pin) -> list[PromptInput]:
    """The pinned prompts as the candidate runs them: the oracle's exact token ids."""
    suite = pin.suite.by_id()
    out = []
    for rec in pin.trace.records:
        sp = suite[rec.id]
        assert sp.max_tokens is not None  # load_pin resolves the suite
        out.append(
            PromptInput(id=rec.id, prompt_token_ids=rec.prompt_token_ids, max_tokens=sp.max_tokens, prompt=sp.display)
        )
    return out


# --------------------------------------------------------------------------- the pipeline's steps


def candidate_header(pin: Pin, info: Mapping[str, Any], top_k: int) -> TraceHeader:
    """A candidate trace's header: the engine's `info()`, its paths said without this
    machine's folders (`gate.core.storage.files.portable`), and the suite it ran."""
    engine = portable(dict(info))
    engine.setdefault("name", "unknown")
    engine.setdefault("version", "unknown")
    extra = {
        "pin_suite_sha256": pin.suite.sha256,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if isinstance(engine.get("moe"), dict):  # MoE routing recorded (docs/guides/moe-routing.md)
        extra["moe"] = engine.pop("moe")
    return TraceHeader(role="candidate", model=pin.model, top_k=top_k, engine=engine, extra=extra)


def free_run(
    engine: Engine,
    prompts: Sequence[PromptInput],
    top_k: int,
    step: int,
    progress: Progress,
    out: list[PromptRecord],
    log: ProgressLog | None = None,
) -> None:
    """Generate `prompts` `step` at a time, appending each finished record to `out` and `log`."""
    for start in range(0, len(prompts), step):
        batch = prompts[start : start + step]
        for rec in generate(engine, batch, top_k):
            out.append(rec)
            if log is not None:
                log.append(rec)
        progress.advance(len(batch))


def run_candidate(
    engine: Engine,
    pin: Pin,
    *,
    progress: Progress = QUIET,
    batch_size: int | None = None,
    info: Mapping[str, Any] | None = None,
) -> Trace:
    """Free-run the candidate greedily over the pinned prompts, `batch_size` prompts a call."""
    prompts = prompt_inputs(pin)
    top_k = pin.top_k
    progress.phase("candidate", len(prompts))
    records: list[PromptRecord] = []
    step = max(1, batch_size if batch_size is not None else batch_size_for(engine, len(prompts)))
    free_run(engine, prompts, top_k, step, progress, records)
    has_top = any(r.top_logprobs is not None for r in records)
    info = info if info is not None else engine_call(engine, "info", engine.info)
    return Trace(
        header=candidate_header(pin, info, top_k if has_top else 0), records=tuple(records), path=f"<{engine.name}>"
    )


def diverged(pin: Pin, candidate: Trace) -> list[str]:
    """Ids of the prompts whose free run differs from the oracle's tokens."""
    return diverged_ids(pin.trace, candidate)


def force_diverged(
    engine: Engine, pin: Pin, candidate: Trace, *, progress: Progress = QUIET
) -> tuple[Trace, tuple[str, ...]]:
    """Teacher-force every diverged prompt through the oracle's tokens (the decode path).

    An engine without forced data (e.g. a server without prompt logprobs) leaves the
    positions after each first divergence unadjudicated instead of failing the run.
    """
    return force_along(engine, pin.trace, candidate, top_k=pin.top_k, progress=progress, skip_unavailable=True)


def add_token_texts(result: GateResult, decode: Callable[[Sequence[int]], list[str] | None]) -> GateResult:
    """Fill the decoded text of each divergence's tokens and alternatives, where missing."""
    if not result.divergences:
        return result
    wanted: set[int] = set()
    for d in result.divergences:
        wanted.add(d.oracle_token)
        if d.candidate_token is not None:
            wanted.add(d.candidate_token)
        wanted.update(t for t, _, _ in d.alternatives)
    ids = sorted(wanted)
    texts = decode(ids)
    if texts is None or len(texts) != len(ids):
        return result
    text = dict(zip(ids, texts, strict=True))
    divs = tuple(
        replace(
            d,
            oracle_text=d.oracle_text if d.oracle_text is not None else text.get(d.oracle_token),
            candidate_text=(
                d.candidate_text
                if d.candidate_text is not None or d.candidate_token is None
                else text.get(d.candidate_token)
            ),
            alternatives=tuple((t, lp, s if s is not None else text.get(t)) for t, lp, s in d.alternatives),
        )
        for d in result.divergences
    )
    return replace(result, divergences=divs)


def shard_pin(pin: Pin, ids: Sequence[str]) -> Pin:
    """The pin restricted to `ids`: a shard (or an interrupted run) is adjudicated on its own prompts."""
    keep = set(ids)
    trace = replace(pin.trace, records=tuple(r for r in pin.trace.records if r.id in keep))
    suite = replace(pin.suite, prompts=tuple(p for p in pin.suite.prompts if p.id in keep))
    return replace(pin, trace=trace, suite=suite)


# --------------------------------------------------------------------------- the pipeline


class RunInterrupted(Interrupted):
    """Ctrl-C during a run: carries the partial outcome (the prompts done so far)."""

    def __init__(self, message: str, outcome: RunOutcome) -> None:
        super().__init__(message)
        self.outcome = outcome


@dataclass(frozen=True, slots=True)
class RunPlan:
    """What `gate run` does beyond the plain gate (every field optional)."""

    engine_options: Mapping[str, str] | None = None
    shard: tuple[int, int] | None = None
    progress_path: Path | None = None
    resume: bool = False
    timeout: float | None = None
    repeat: int = 1
    # A default progress path (nobody asked for one): where it cannot be written, the run
    # goes on without one, as a run in a read-only folder did before progress files.
    progress_optional: bool = False


def nondeterminism(runs: Sequence[Sequence[PromptRecord]]) -> list[str]:
    """Each position whose token or top-k logprobs changed between repeats, as text."""
    changes: list[str] = []
    first = runs[0]
    for n, other in enumerate(runs[1:], start=2):
        for a, b in zip(first, other, strict=True):
            k = max(len(a.token_ids), len(b.token_ids))
            for i in range(k):
                ta = a.token_ids[i] if i < len(a.token_ids) else None
                tb = b.token_ids[i] if i < len(b.token_ids) else None
                if ta != tb:
                    changes.append(f"prompt {a.id!r} position {i}: token {ta} in repeat 1, {tb} in repeat {n}")
                    break  # later positions follow a different context
                la = _plain_top(a, i)
                lb = _plain_top(b, i)
                if la != lb:
                    changes.append(
                        f"prompt {a.id!r} position {i}: same token {ta}, top-k logprobs {la} in repeat 1, "
                        f"{lb} in repeat {n}"
                    )
    return changes


def _plain_top(rec: PromptRecord, i: int) -> list[list[Any]] | None:
    if rec.top_logprobs is None or i >= len(rec.top_logprobs):
        return None
    return [[int(t), float(lp)] for t, lp in rec.top_logprobs[i]]


def gate_run(
    engine: Engine,
    pin: Pin,
    doctrine: Doctrine,
    plan: RunPlan,
    *,
    progress: Progress | None = None,
    timings: Timings | None = None,
    notes: list[str] | None = None,
) -> RunOutcome:
    """The whole gate for a loaded engine, with a progress file, resume, shard, watchdog and repeats.

    Ctrl-C during the free run raises RunInterrupted carrying the report of the prompts
    done so far (not teacher-forced: their later positions count as unadjudicated)."""
    progress = progress or QUIET
    timings = timings or Timings()
    notes = notes if notes is not None else []
    whole = pin
    if plan.shard is not None:
        k, n = plan.shard
        pin = shard_pin(pin, select_shard(pin.suite.ids, k, n))
    with timed(timings, "check_s"):
        info = dict(engine_call(engine, "info", engine.info))
        info.update(model_hashes(info))
        check_provenance(pin, info, where=f"engine {engine.name!r}")
        vocab = vocab_size_of(info, pin.provenance("vocab_size"))
        run_engine = GuardedEngine(engine, timeout=plan.timeout, vocab_size=vocab)
        check_prompt_tokens(run_engine, pin)
    if isinstance(engine, ReplaysRouting):  # MoE: the engine may route as the oracle did (docs/guides/moe-routing.md)
        engine.replay_routing(oracle_routing(pin.trace))
    top_k = pin.top_k
    header = candidate_header(whole, info, top_k)  # the whole suite's hash: shards merge back into it
    extra = dict(header.extra)
    if plan.shard is not None:
        extra["shard"] = format_shard(*plan.shard)
    progress_header = replace(header, extra={**extra, "engine_options": dict(plan.engine_options or {})})
    prompts = prompt_inputs(pin)
    step = max(1, batch_size_for(run_engine, len(prompts)))

    log: ProgressLog | None = None
    records: list[PromptRecord] = []
    if plan.progress_path is not None:
        if plan.resume:
            log, done = ProgressLog.resume(plan.progress_path, progress_header)
            wanted = {p.id for p in prompts}
            stray = [r.id for r in done if r.id not in wanted]
            if stray:
                raise InputError(
                    f"--resume: progress file {plan.progress_path} holds prompts not in this run: {stray[:5]}"
                )
            records = list(done)
            notes.append(f"resuming {plan.progress_path}: {len(records)} of {len(prompts)} prompts already done")
        else:
            try:
                log = ProgressLog.start(plan.progress_path, progress_header)
            except InputError as exc:
                if not plan.progress_optional:
                    raise
                notes.append(f"running without a progress file (--resume will not be possible): {exc}")
    done_ids = {r.id for r in records}
    todo = [p for p in prompts if p.id not in done_ids]

    with timed(timings, "candidate_s"):
        progress.phase("candidate", len(prompts))
        progress.advance(len(records))
        try:
            free_run(run_engine, todo, top_k, step, progress, records, log)
        except KeyboardInterrupt:
            if log is not None:
                log.close()
            raise _interrupted(pin, records, info, header, doctrine, timings, plan) from None
        except BaseException:
            if log is not None:
                log.close()
            raise
        order = {p.id: i for i, p in enumerate(prompts)}
        records.sort(key=lambda r: order[r.id])
        for n in range(2, plan.repeat + 1):
            progress.phase(f"repeat {n}", len(prompts))
            again: list[PromptRecord] = []
            free_run(run_engine, prompts, top_k, step, progress, again)
            changes = nondeterminism([records, again])
            if changes:
                if log is not None:
                    log.remove()
                more = f" (and {len(changes) - _SHOWN} more)" if len(changes) > _SHOWN else ""
                raise EngineError(
                    f"engine {engine.name!r} is not deterministic: {len(changes)} position(s) changed between "
                    f"repeats: {'; '.join(changes[:_SHOWN])}{more}. An engine whose greedy output changes from "
                    "run to run cannot be gated token-exactly: make it deterministic (batch-invariant kernels, "
                    "fixed batch size, no speculative decoding) and rerun"
                )
    has_top = any(r.top_logprobs is not None for r in records)
    final_header = replace(header, top_k=top_k if has_top else 0, extra=extra)
    late = late_info(engine)
    if late:
        # What only the answers showed (a server answering as another model): in the header, and said.
        final_header = replace(final_header, engine={**final_header.engine, **late})
        notes.extend(f"gate: warning: {w}" for w in late.get("warnings", ()))
    candidate = Trace(header=final_header, records=tuple(records), path=f"<{engine.name}>")
    with timed(timings, "force_s"):
        try:
            candidate, forced = force_diverged(run_engine, pin, candidate, progress=progress)
        except KeyboardInterrupt:
            # The free run is complete and in the progress file; forcing starts over on resume.
            raise _interrupted(pin, records, info, header, doctrine, timings, plan) from None
    with timed(timings, "adjudicate_s"):
        result = judge(pin.trace, candidate, doctrine)
        result = add_token_texts(
            result, lambda ids: engine_call(engine, "decode_tokens", partial(engine.decode_tokens, ids))
        )
    if log is not None:
        log.remove()
    record = run_record(
        pin,
        info,
        timings,
        forced,
        shard=format_shard(*plan.shard) if plan.shard is not None else None,
        repeats=plan.repeat if plan.repeat > 1 else None,
    )
    return RunOutcome(result=replace(result, run=record), candidate=candidate, timings=timings, forced_prompts=forced)


def _interrupted(
    pin: Pin,
    records: Sequence[PromptRecord],
    info: Mapping[str, Any],
    header: TraceHeader,
    doctrine: Doctrine,
    timings: Timings,
    plan: RunPlan,
) -> RunInterrupted:
    total = len(pin.trace.records)
    part = shard_pin(pin, [r.id for r in records])
    candidate = Trace(header=header, records=tuple(records), path="<interrupted>")
    result = judge(part.trace, candidate, doctrine)
    record = run_record(part, info, timings, (), interrupted=Interruption(len(records), total))
    outcome = RunOutcome(result=replace(result, run=record), candidate=candidate, timings=timings)
    where = (
        f"; progress kept in {plan.progress_path}: `gate run --resume` (same options) continues"
        if plan.progress_path is not None
        else ""
    )
    return RunInterrupted(
        f"interrupted after {len(records)} of {total} prompts: the report covers only those{where}", outcome
    )


def gate_against_pin(
    engine: Engine,
    pin: Pin,
    doctrine: Doctrine,
    *,
    progress: Progress | None = None,
    timings: Timings | None = None,
) -> RunOutcome:
    """The whole gate for a loaded engine: checks, free run, forced decode, adjudication.

    This is `gate_run` with a plain plan: no progress file, shard,
    watchdog or repeats.
    """
    return gate_run(engine, pin, doctrine, RunPlan(), progress=progress, timings=timings)


def gate_trace_against_pin(
    pin: Pin, candidate: Trace, doctrine: Doctrine, *, timings: Timings | None = None
) -> RunOutcome:
    """Bring your own trace: adjudicate a candidate trace an engine wrote itself."""
    timings = timings or Timings()
    with timed(timings, "check_s"):
        header = candidate.header
        stated = {**header.extra, **header.engine}
        check_provenance(
            pin,
            stated,
            model=header.model,
            where=f"the candidate trace {candidate.path}",
            hashes={k: str(stated[k]) for k in HASH_KEYS if stated.get(k)},
        )
    with timed(timings, "adjudicate_s"):
        result = judge(pin.trace, candidate, doctrine)
    record = run_record(pin, dict(header.engine), timings, ())
    return RunOutcome(result=replace(result, run=record), candidate=candidate, timings=timings)


def run_record(
    pin: Pin,
    info: Mapping[str, Any],
    timings: Timings,
    forced: Sequence[str],
    *,
    shard: str | None = None,
    repeats: int | None = None,
    interrupted: Interruption | None = None,
) -> RunRecord:
    return RunRecord(
        command="gate run",
        pin=display_path(pin.folder.pin_path),
        pin_created_at=pin.provenance("created_at"),
        oracle={k: pin.trace.header.engine.get(k) for k in ("name", "version")},
        candidate={k: info.get(k) for k in ("name", "version", "device", "dtype") if info.get(k) is not None},
        forced_prompts=tuple(forced),
        timings=timings.to_dict(),
        shard=shard,
        repeats=repeats,
        interrupted=interrupted,
        machine=machine_meta(pin.trace.header, info),
    )
