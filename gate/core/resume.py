"""Long runs: a progress file, `--resume`, `--shard K/N`, `--repeat N`, Ctrl-C.

`gate run` appends each finished prompt's free-run record to a progress file as it goes
(a trace v1 header first, then one record a line, each written, flushed and fsynced), so
a Ctrl-C, an engine crash or an out-of-memory kill loses at most the prompt in flight.
`gate run --resume` reads it back: the header must be this run's (model, pin suite,
engine provenance and options, top-k, shard), a last line torn by a kill is dropped, and
only the prompts not in it are run. Forced decoding and adjudication happen once the
free run is complete, so the final report is the one an uninterrupted run gives. The
file is removed when the run completes.

`--repeat N` free-runs the candidate N times and stops with exit 3 when any token or
logprob differs between repeats: an engine that is not deterministic cannot be gated
token-exactly (its verdict would depend on the run), which is an engine fault, not a
defect the gate found.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import IO, Any

from gate.core.adjudicate import compare
from gate.core.doctrine import Doctrine
from gate.core.faults import GuardedEngine, vocab_size_of
from gate.core.pins import Pin
from gate.core.runner import (
    Progress,
    RunOutcome,
    Timings,
    _checked,
    _NoProgress,
    _timed,
    _with_meta,
    add_token_texts,
    batch_size_for,
    candidate_header,
    check_prompt_ids,
    check_provenance,
    engine_call,
    force_diverged,
    model_hashes,
    prompt_inputs,
    run_meta,
)
from gate.core.shards import format_shard, select_shard
from gate.core.trace import PromptRecord, Trace, TraceHeader, encode_header, encode_record, read_trace
from gate.engines.base import Engine, PromptInput
from gate.errors import EngineError, InputError, Interrupted

PROGRESS_SUFFIX = ".partial.jsonl"
# Header keys that differ between a run and its resumption.
_UNCOMPARED = frozenset({"created_at"})
# How many changed positions a nondeterminism message lists.
_SHOWN = 5


def default_progress_path(model: str, engine: str, shard: tuple[int, int] | None = None) -> Path:
    """`$GATE_RUNS_DIR` (else `./.gate/runs`) `/<model>/<engine>[.shard-K-of-N].partial.jsonl`."""
    root = Path(os.environ.get("GATE_RUNS_DIR") or Path(".gate") / "runs")
    safe_engine = "".join(c if c.isalnum() or c in "-_." else "_" for c in engine)
    tag = f".shard-{shard[0]}-of-{shard[1]}" if shard else ""
    return root.joinpath(*model.split("/")) / f"{safe_engine}{tag}{PROGRESS_SUFFIX}"


def shard_pin(pin: Pin, ids: Sequence[str]) -> Pin:
    """The pin restricted to `ids`: a shard (or an interrupted run) is adjudicated on its own prompts."""
    keep = set(ids)
    trace = replace(pin.trace, records=tuple(r for r in pin.trace.records if r.id in keep))
    suite = replace(pin.suite, prompts=tuple(p for p in pin.suite.prompts if p.id in keep))
    return replace(pin, trace=trace, suite=suite)


# --------------------------------------------------------------------------- the progress file


def _comparable(header: TraceHeader) -> dict[str, Any]:
    return {k: v for k, v in header.to_dict().items() if k not in _UNCOMPARED}


class ProgressLog:
    """Append-only progress file: header first, then one fsynced record per finished prompt."""

    def __init__(self, path: Path, fh: IO[bytes]) -> None:
        self.path = path
        self._fh = fh

    @classmethod
    def start(cls, path: Path, header: TraceHeader) -> ProgressLog:
        """A new progress file (replacing an old one) holding only `header`.

        The old file is unlinked, never truncated: a run still writing it (two runs of one
        model and engine in one folder) goes on writing its own, now nameless, file and
        cannot interleave records with this one."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            fh = open(path, "xb")  # noqa: SIM115  # closed by close()
        except OSError as exc:
            raise InputError(f"progress file {path}: cannot write there: {exc.strerror or exc}") from None
        log = cls(path, fh)
        log._write(encode_header(header))
        return log

    @classmethod
    def resume(cls, path: Path, header: TraceHeader) -> tuple[ProgressLog, list[PromptRecord]]:
        """Reopen `path` for appending; return it and the records it holds.

        The header must equal `header` (but for when it was written); a torn last line (no
        newline: the writer was killed mid-record) is cut off before appending."""
        if not path.is_file():
            raise InputError(
                f"--resume: no progress file {path}: nothing to resume (run without --resume to start, "
                "or pass --progress-file)"
            )
        data = path.read_bytes()
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            raise InputError(f"--resume: progress file {path} has no complete header line: start afresh")
        if cut < len(data):
            with open(path, "r+b") as fh:
                fh.truncate(cut)
                fh.flush()
                os.fsync(fh.fileno())
        done = read_trace(path, role="candidate")
        want, found = _comparable(header), _comparable(done.header)
        if want != found:
            diff = sorted(k for k in want.keys() | found.keys() if want.get(k) != found.get(k))
            key = diff[0]
            raise InputError(
                f"--resume: progress file {path} is from another run: header field {key!r} is {found.get(key)!r}, "
                f"this run's is {want.get(key)!r}; rerun without --resume to start afresh"
            )
        return cls(path, open(path, "ab")), list(done.records)

    def _write(self, data: bytes) -> None:
        self._fh.write(data)
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def append(self, record: PromptRecord) -> None:
        self._write(encode_record(record))

    def close(self) -> None:
        self._fh.close()

    def remove(self) -> None:
        """Close and delete the file, unless another run has since put its own in its place."""
        with contextlib.suppress(OSError, ValueError):  # ValueError: already closed
            if os.path.samestat(os.fstat(self._fh.fileno()), os.stat(self.path)):
                self.path.unlink()
        self.close()


# --------------------------------------------------------------------------- running


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


def _free_run(
    engine: Engine,
    prompts: Sequence[PromptInput],
    top_k: int,
    step: int,
    progress: Progress,
    log: ProgressLog | None,
    out: list[PromptRecord],
) -> None:
    """Generate `prompts` `step` at a time, appending each finished record to `out` and `log`."""
    for start in range(0, len(prompts), step):
        batch = prompts[start : start + step]
        got = engine_call(engine, "generate", partial(engine.generate, batch, top_k))
        for rec in _checked(engine, batch, got):
            out.append(rec)
            if log is not None:
                log.append(rec)
        progress.advance(len(batch))


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
    progress = progress or _NoProgress()
    timings = timings or Timings()
    notes = notes if notes is not None else []
    whole = pin
    if plan.shard is not None:
        k, n = plan.shard
        pin = shard_pin(pin, select_shard(pin.suite.ids, k, n))
    with _timed(timings, "check_s"):
        info = dict(engine_call(engine, "info", engine.info))
        info.update(model_hashes(info))
        check_provenance(pin, info, where=f"engine {engine.name!r}")
        vocab = vocab_size_of(info, pin.provenance("vocab_size"))
        guarded = GuardedEngine(engine, timeout=plan.timeout, vocab_size=vocab)
        check_prompt_ids(guarded, pin)  # type: ignore[arg-type]
    run_engine: Engine = guarded  # type: ignore[assignment]
    top_k = pin.top_k
    header = candidate_header(whole, info, top_k)  # the whole suite's hash: shards merge back into it
    extra = dict(header.extra)
    if plan.shard is not None:
        extra["shard"] = format_shard(*plan.shard)
    progress_header = replace(header, extra={**extra, "engine_options": dict(plan.engine_options or {})})
    prompts = prompt_inputs(pin)
    step = max(1, batch_size_for(guarded, len(prompts)))  # type: ignore[arg-type]

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

    with _timed(timings, "candidate_s"):
        progress.phase("candidate", len(prompts))
        progress.advance(len(records))
        try:
            _free_run(run_engine, todo, top_k, step, progress, log, records)
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
            _free_run(run_engine, prompts, top_k, step, progress, None, again)
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
    candidate = Trace(header=final_header, records=tuple(records), path=f"<{engine.name}>")
    with _timed(timings, "force_s"):
        try:
            candidate, forced = force_diverged(run_engine, pin, candidate, progress=progress)
        except KeyboardInterrupt:
            # The free run is complete and in the progress file; forcing starts over on resume.
            raise _interrupted(pin, records, info, header, doctrine, timings, plan) from None
    with _timed(timings, "adjudicate_s"):
        result = compare(pin.trace, candidate, doctrine)
        result = add_token_texts(
            result, lambda ids: engine_call(engine, "decode_tokens", partial(engine.decode_tokens, ids))
        )
    if log is not None:
        log.remove()
    meta = run_meta(pin, info, timings, forced)
    if plan.shard is not None:
        meta["shard"] = format_shard(*plan.shard)
    if plan.repeat > 1:
        meta["repeats"] = plan.repeat
    return RunOutcome(result=_with_meta(result, meta), candidate=candidate, timings=timings, forced_prompts=forced)


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
    result = compare(part.trace, candidate, doctrine)
    meta = run_meta(part, info, timings, ())
    meta["interrupted"] = {"prompts_done": len(records), "prompts_total": total}
    outcome = RunOutcome(result=_with_meta(result, meta), candidate=candidate, timings=timings)
    where = (
        f"; progress kept in {plan.progress_path}: `gate run --resume` (same options) continues"
        if plan.progress_path is not None
        else ""
    )
    return RunInterrupted(
        f"interrupted after {len(records)} of {total} prompts: the report covers only those{where}", outcome
    )
