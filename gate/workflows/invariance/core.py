"""`gate invariance`: the candidate against itself under schedules.

The engine runs the pin's prompts greedily under a baseline schedule, then under each cell's
schedule; `gate.core.verdict.invariance` compares each cell with its reference. The cells,
where the engine declares the knob (`HasScheduleKnobs`, `gate.core.engine`):

- repeat: the baseline again (no knob needed);
- batch: `batch_size` N against the baseline's (1 when the baseline batches, else N);
- concurrency: a server client's requests in flight, N against the baseline's 1;
- max_num_seqs: the scheduler's sequence limit set to N;
- needle: one prompt alone, then inside a batch of N-1 others (the alone run is its reference);
- shuffle: the prompts in a seeded random order (the same batch size);
- threads: `threads` 2 against the baseline's 1;
- chunked_prefill: prompts prefilled in chunks of C tokens (`chunked_prefill`, else
  llama.cpp's micro-batch `n_ubatch`);
- forced_decode: the engine teacher-forced along its own baseline tokens (`force`, its own
  path: a decode step per token on the engine that decodes) against its free run;
- prefill: the same through one prefill pass (`force_mode=prefill`);
- prefix_cache: the prompts served with their prefix cached (`prefix_cache` 1: each batch of
  prompts served once to fill the cache, then again, the second run judged) against the
  baseline's cold cache (`prefix_cache` 0 in the baseline where the engine declares the knob).
  An engine that caches whole blocks (`cache_block`) runs the cell with blocks of
  `InvariancePlan.cache_block` tokens, unless its options set them, so that short prompts
  fill a block; its reference is then a cold run with the same blocks, not the baseline.
  Where the engine counts its reuse (`ReportsPrefixReuse`, and its count is not None), the
  cell notes what the judged run took from the cache (a note: the verdict does not read it).

Every run is a free run (the forced cells excepted): each schedule's verdict against the pin
leaves the positions after a prompt's first divergence from the pin unadjudicated, as
`gate run` does for an engine without forced data. No printing and no torch here.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from gate.core.engine import (
    Engine,
    ForcedDecodeUnavailable,
    ForcesDecode,
    PromptInput,
    ReportsPrefixReuse,
    schedule_knobs,
)
from gate.core.pins.pin import Pin
from gate.core.traces.trace import PromptRecord, Trace
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.invariance import (
    CacheReuse,
    CellResult,
    InvarianceResult,
    Schedule,
    compare_runs,
    forced_record,
    not_run,
    pin_verdict,
)
from gate.errors import EngineError, InputError
from gate.workflows.common.engine_calls import batch_size_for, engine_call, generate, open_engine
from gate.workflows.common.guard import GuardedEngine, vocab_size_of
from gate.workflows.common.progress import QUIET, Progress
from gate.workflows.common.provenance import check_prompt_tokens, check_provenance, model_hashes
from gate.workflows.run.core import add_token_texts, candidate_header, prompt_inputs, shard_pin

CELLS = (
    "repeat",
    "batch",
    "concurrency",
    "max_num_seqs",
    "needle",
    "shuffle",
    "threads",
    "chunked_prefill",
    "forced_decode",
    "prefill",
    "prefix_cache",
)

_ON = frozenset({"1", "true", "yes", "on"})

# Cells run under the baseline's options, on the baseline's engine.
_BASELINE_OPTIONS = frozenset({"repeat", "shuffle", "forced_decode"})


@dataclass(frozen=True, slots=True)
class InvariancePlan:
    """Which cells run, and their sizes."""

    cells: tuple[str, ...] = CELLS
    batch: int = 8  # N of the batch, max_num_seqs and needle cells
    seed: int = 0  # the shuffle's
    threads: int = 2  # the threads cell's (the baseline runs 1)
    chunk: int = 8  # tokens per prefill chunk (the chunked_prefill cell)
    # Tokens per cache block in the prefix_cache cell, on an engine that declares `cache_block`
    # (vLLM: 32, the smallest its CPU attention kernels take; its default, 128, is longer
    # than every prompt of the default suite, so nothing would be cached).
    cache_block: int = 32
    strict: bool = False

    def __post_init__(self) -> None:
        unknown = [c for c in self.cells if c not in CELLS]
        if unknown:
            raise InputError(f"--schedules: unknown cell(s) {', '.join(unknown)} (known: {', '.join(CELLS)})")
        if not self.cells:
            raise InputError("--schedules: no cell named")
        for name, value, low in (
            ("batch", self.batch, 2),
            ("threads", self.threads, 2),
            ("chunk", self.chunk, 1),
            ("cache-block", self.cache_block, 1),
        ):
            if value < low:
                raise InputError(f"--{name} {value}: must be at least {low}")


def parse_cells(raw: Sequence[str] | None) -> tuple[str, ...]:
    """`--schedules a,b --schedules c` to cell names, in the order of `CELLS`."""
    if not raw:
        return CELLS
    named = {s.strip() for part in raw for s in part.split(",") if s.strip()}
    unknown = sorted(named - set(CELLS))
    if unknown:
        raise InputError(f"--schedules: unknown cell(s) {', '.join(unknown)} (known: {', '.join(CELLS)})")
    if not named:
        raise InputError("--schedules: no cell named")
    return tuple(c for c in CELLS if c in named)


Loader = Callable[[Mapping[str, str]], Engine]


@dataclass(slots=True)
class _Runner:
    """The engine under one set of options, loaded once and shared by the cells that use it."""

    pin: Pin
    load: Loader
    name: str
    progress: Progress
    options: dict[str, str] | None = None
    engine: Engine | None = None
    closer: Any = None
    info: dict[str, Any] | None = None

    def engine_with(self, options: Mapping[str, str]) -> Engine:
        wanted = dict(options)
        if self.engine is not None and self.options == wanted:
            return self.engine
        self.close()
        self.closer = open_engine(partial(self.load, wanted), self.name)
        engine = self.closer.__enter__()
        info = dict(engine_call(engine, "info", engine.info))
        info.update(model_hashes(info))
        check_provenance(self.pin, info, where=f"engine {self.name!r}")
        guarded = GuardedEngine(engine, vocab_size=vocab_size_of(info, self.pin.provenance("vocab_size")))
        check_prompt_tokens(guarded, self.pin)
        self.engine, self.options, self.info = guarded, wanted, info
        return guarded

    def close(self) -> None:
        if self.closer is not None:
            closer, self.closer, self.engine = self.closer, None, None
            closer.__exit__(None, None, None)


@dataclass(frozen=True, slots=True)
class _Matrix:
    """What every cell runs against: the engine (`runner`) and its knobs, the baseline's
    options, prompts, batch size (`step`) and trace, the doctrine and the plan."""

    runner: _Runner
    knobs: Mapping[str, str]
    base: Mapping[str, str]
    prompts: Sequence[PromptInput]
    step: int
    baseline: Trace
    doctrine: Doctrine
    plan: InvariancePlan


def run_invariance(
    load: Loader,
    engine_class: object,
    pin: Pin,
    doctrine: Doctrine,
    plan: InvariancePlan,
    *,
    engine_name: str,
    options: Mapping[str, str] | None = None,
    progress: Progress = QUIET,
) -> InvarianceResult:
    """The matrix for one engine: the baseline under `options`, then each planned cell.

    `load(options)` builds the engine; it is called once per distinct set of options, and
    one engine is open at a time."""
    knobs = schedule_knobs(engine_class)
    user = dict(options or {})
    base_opts = dict(user)
    base_knobs: dict[str, Any] = {}
    if "threads" in knobs and knobs["threads"] not in user:
        base_opts[knobs["threads"]] = "1"
    if "threads" in knobs:
        base_knobs["threads"] = base_opts[knobs["threads"]]
    # A server's baseline: one request in flight (its batch of one), unless asked otherwise.
    if "concurrency" in knobs and knobs["concurrency"] not in user:
        base_opts[knobs["concurrency"]] = "1"
    if "concurrency" in knobs:
        base_knobs["concurrency"] = base_opts[knobs["concurrency"]]
    # The baseline's cache starts cold for every prompt, so that the prefix_cache cell is the
    # one cell that reuses a prefix, unless asked otherwise.
    if "prefix_cache" in knobs and knobs["prefix_cache"] not in user:
        base_opts[knobs["prefix_cache"]] = "0"
    if "prefix_cache" in knobs:
        base_knobs["prefix_cache"] = base_opts[knobs["prefix_cache"]]
    runner = _Runner(pin=pin, load=load, name=engine_name, progress=progress)
    prompts = prompt_inputs(pin)
    try:
        engine = runner.engine_with(base_opts)
        step = max(1, batch_size_for(engine, len(prompts)))
        base_knobs["batch_size"] = step
        baseline_schedule = Schedule("baseline", base_knobs, "the engine's own schedule, prompts in pin order")
        baseline = _free(runner, base_opts, prompts, step, "baseline")
        notes = _notes(baseline, doctrine)
        # The cells that run under the baseline's own options first, while its engine is
        # loaded (a load is minutes for some engines); the report keeps the plan's order.
        order = sorted(plan.cells, key=lambda c: c not in _BASELINE_OPTIONS)
        matrix = _Matrix(runner, knobs, base_opts, prompts, step, baseline, doctrine, plan)
        done = {c: _cell(c, matrix) for c in order}
        cells = [done[c] for c in plan.cells]
    finally:
        runner.close()
    return InvarianceResult(
        engine=engine_name,
        model=pin.model,
        baseline=baseline_schedule,
        cells=tuple(cells),
        doctrine=doctrine,
        strict=plan.strict,
        baseline_pin=pin_verdict(compare(pin.trace, baseline, doctrine)),
        engine_options=user,
        knobs=knobs,
        notes=notes,
    )


def _notes(baseline: Trace, doctrine: Doctrine) -> tuple[str, ...]:
    if all(r.token_logits is not None for r in baseline.records):
        return ()
    if doctrine.evidence is not None:
        return (
            "the baseline has no raw logits: grid steps are taken at the evidence rule's least logit "
            f"(|logit| {doctrine.evidence.floor_logit:g}), the smallest unit the rule allows",
        )
    return ("the baseline has no raw logits: flips are judged by the doctrine's near_tie_mnats alone",)


def _cell(cell: str, m: _Matrix) -> CellResult:
    n = len(m.prompts)

    def with_knob(knob: str, value: Any) -> dict[str, str]:
        return {**m.base, m.knobs[knob]: str(value)}

    def free_cell(schedule: Schedule, opts: Mapping[str, str], order: Sequence[PromptInput], size: int) -> CellResult:
        trace = _free(m.runner, opts, order, size, schedule.cell)
        return _judged(m.baseline, trace, m.doctrine, schedule, m.runner)

    if cell == "repeat":
        return free_cell(Schedule("repeat", {}, "the baseline again"), m.base, m.prompts, m.step)
    if cell in ("batch", "concurrency"):
        # Many against one, or one where the baseline already runs many: prompts per batch,
        # or a server's requests in flight (it forms its batches from what is in flight).
        size_knob = "batch_size" if cell == "batch" else "concurrency"
        now = m.step if cell == "batch" else int(m.base.get(m.knobs.get(size_knob, ""), "1"))
        other = 1 if now > 1 else min(m.plan.batch, n)
        unit = "prompt(s) per batch" if cell == "batch" else "request(s) in flight"
        schedule = Schedule(cell, {size_knob: other}, f"{other} {unit} against the baseline's {now}")
        if size_knob not in m.knobs:
            return not_run(schedule, f"the engine states no {size_knob} knob")
        if other == now:
            return not_run(schedule, f"the pin has {n} prompt(s): no other {size_knob} to run")
        return free_cell(schedule, with_knob(size_knob, other), m.prompts, other)
    if cell == "max_num_seqs":
        schedule = Schedule("max_num_seqs", {"max_num_seqs": m.plan.batch}, f"at most {m.plan.batch} sequences a step")
        if "max_num_seqs" not in m.knobs:
            return not_run(schedule, "the engine states no max_num_seqs knob")
        return free_cell(schedule, with_knob("max_num_seqs", m.plan.batch), m.prompts, m.step)
    if cell == "needle":
        return _needle(m)
    if cell == "shuffle":
        order = list(m.prompts)
        random.Random(m.plan.seed).shuffle(order)
        schedule = Schedule("shuffle", {"order": f"shuffled (seed {m.plan.seed})"}, "the prompts in a seeded order")
        return free_cell(schedule, m.base, order, m.step)
    if cell == "threads":
        schedule = Schedule(
            "threads", {"threads": m.plan.threads}, f"{m.plan.threads} threads against the baseline's 1"
        )
        if "threads" not in m.knobs:
            return not_run(schedule, "the engine states no threads knob")
        if m.base.get(m.knobs["threads"]) == str(m.plan.threads):
            return not_run(schedule, f"the baseline already runs {m.plan.threads} threads")
        return free_cell(schedule, with_knob("threads", m.plan.threads), m.prompts, m.step)
    if cell == "chunked_prefill":
        knob = next((k for k in ("chunked_prefill", "n_ubatch") if k in m.knobs), None)
        what = f"prompts prefilled {m.plan.chunk} tokens at a time"
        schedule = Schedule("chunked_prefill", {knob or "chunked_prefill": m.plan.chunk}, what)
        if knob is None:
            return not_run(schedule, "the engine states no chunked_prefill or n_ubatch knob")
        return free_cell(schedule, with_knob(knob, m.plan.chunk), m.prompts, m.step)
    if cell == "prefix_cache":
        return _prefix_cached(m, m.plan.cache_block)
    if cell == "forced_decode":
        schedule = Schedule("forced_decode", {}, "forced along its own tokens against its free run")
        return _forced(m.runner, m.base, m.baseline, m.doctrine, schedule)
    # prefill
    schedule = Schedule("prefill", {"force_mode": "prefill"}, "its own tokens in one prefill pass against its free run")
    if "force_mode" not in m.knobs:
        return not_run(schedule, "the engine states no force_mode knob (no one-pass prefill of fed tokens)")
    return _forced(m.runner, {**m.base, m.knobs["force_mode"]: "prefill"}, m.baseline, m.doctrine, schedule)


def _judged(baseline: Trace, trace: Trace, doctrine: Doctrine, schedule: Schedule, runner: _Runner) -> CellResult:
    part = shard_pin(runner.pin, [r.id for r in trace.records])
    against_pin = pin_verdict(compare(part.trace, trace, doctrine))
    return _texts(compare_runs(baseline, trace, doctrine, schedule, pin=against_pin), runner.engine)


def _texts(cell: CellResult, engine: Engine | None) -> CellResult:
    if engine is None or not cell.flips:
        return cell
    from gate.core.verdict.result import GateResult

    shell = GateResult(doctrine=Doctrine(), prompts=(), divergences=cell.flips)
    filled = add_token_texts(
        shell, lambda ids: engine_call(engine, "decode_tokens", partial(engine.decode_tokens, ids))
    )
    return replace(cell, flips=filled.divergences)


def _free(runner: _Runner, opts: Mapping[str, str], order: Sequence[PromptInput], size: int, what: str) -> Trace:
    """A free run of `order`, `size` prompts per generate call, its records in pin order."""
    engine = runner.engine_with(opts)
    pin = runner.pin
    runner.progress.phase(what, len(order))
    records: list[PromptRecord] = []
    for start in range(0, len(order), size):
        batch = order[start : start + size]
        records.extend(generate(engine, batch, pin.top_k))
        runner.progress.advance(len(batch))
    rank = {r.id: i for i, r in enumerate(pin.trace.records)}
    records.sort(key=lambda r: rank[r.id])
    return _trace(runner, records, what)


def _prefix_cached(m: _Matrix, block: int) -> CellResult:
    """Each batch of prompts served twice with the prefix cache on: the first call fills the
    cache (and may itself reuse an earlier prompt's prefix), the second finds each prompt's
    own prefix cached; the second is judged against the cold baseline, or, where the cell
    sets the engine's cache block, against a cold run with the same blocks."""
    schedule = Schedule("prefix_cache", {"prefix_cache": 1}, "each prompt again with its prefix cached, against cold")
    if "prefix_cache" not in m.knobs:
        return not_run(schedule, "the engine states no prefix_cache knob (no cache it reuses across requests)")
    if str(m.base.get(m.knobs["prefix_cache"], "0")).strip().lower() in _ON:
        return not_run(schedule, "the baseline already reuses the prefix cache: no cold run to compare with")
    cold, reference_name = dict(m.base), "baseline"
    if "cache_block" in m.knobs and m.knobs["cache_block"] not in m.base:
        # The block size may change the numbers themselves (the attention kernel walks the
        # KV cache a block at a time): the cold reference runs with the same blocks.
        cold[m.knobs["cache_block"]] = str(block)
        schedule = Schedule(
            "prefix_cache",
            {"prefix_cache": 1, "cache_block": block},
            f"each prompt again with its prefix cached, against cold, both in {block}-token blocks",
        )
        reference_name = f"cold, {block}-token blocks"
    reference = m.baseline if cold == dict(m.base) else _free(m.runner, cold, m.prompts, m.step, "prefix_cache cold")
    engine = m.runner.engine_with({**cold, m.knobs["prefix_cache"]: "1"})
    m.runner.progress.phase("prefix_cache", 2 * len(m.prompts))
    records: list[PromptRecord] = []
    hits = reused = 0
    for start in range(0, len(m.prompts), m.step):
        batch = m.prompts[start : start + m.step]
        generate(engine, batch, m.runner.pin.top_k)  # fills the cache
        m.runner.progress.advance(len(batch))
        before = _reuse(engine)
        records.extend(generate(engine, batch, m.runner.pin.top_k))
        after = _reuse(engine)
        if before is not None and after is not None:
            hits, reused = hits + after[0] - before[0], reused + after[1] - before[1]
        m.runner.progress.advance(len(batch))
    rank = {r.id: i for i, r in enumerate(m.runner.pin.trace.records)}
    records.sort(key=lambda r: rank[r.id])
    trace = _trace(m.runner, records, "prefix_cache")
    part = shard_pin(m.runner.pin, [r.id for r in trace.records])
    against_pin = pin_verdict(compare(part.trace, trace, m.doctrine))
    cell = compare_runs(reference, trace, m.doctrine, schedule, reference_name=reference_name, pin=against_pin)
    counted = _reuse(engine) is not None
    return replace(_texts(cell, engine), cache_reuse=CacheReuse(hits, reused) if counted else None)


def _reuse(engine: Engine) -> tuple[int, int] | None:
    """(requests served from the prefix cache, tokens taken from it) so far, as the engine
    counts them; None where it does not."""
    if not isinstance(engine, ReportsPrefixReuse):
        return None
    counted = engine_call(engine, "prefix_reuse", engine.prefix_reuse)
    if counted is None:
        return None
    hits, tokens = counted
    return int(hits), int(tokens)


def _trace(runner: _Runner, records: Sequence[PromptRecord], what: str) -> Trace:
    header = candidate_header(runner.pin, runner.info or {}, runner.pin.top_k)
    return Trace(header=header, records=tuple(records), path=f"<{runner.name} {what}>")


def _needle(m: _Matrix) -> CellResult:
    n = len(m.prompts)
    size = min(m.plan.batch, n)
    # The needle: the prompt the pin generates the most tokens for (the first among equals).
    lengths = {r.id: len(r.token_ids) for r in m.runner.pin.trace.records}
    needle = max(m.prompts, key=lambda p: lengths.get(p.id, 0))
    i = m.prompts.index(needle)
    others = [m.prompts[(i + k) % n] for k in range(1, size)]
    half = len(others) // 2
    batch = [*others[:half], needle, *others[half:]]
    schedule = Schedule(
        "needle",
        {"needle": needle.id, "batch_size": size, "place": batch.index(needle)},
        f"prompt {needle.id!r} alone, then inside a batch of {size}",
    )
    if size < 2:
        return not_run(schedule, "the pin has one prompt: no batch to put it in")
    if m.step >= size:
        opts: Mapping[str, str] = m.base  # the baseline already sends `size` prompts to one call
    elif "batch_size" in m.knobs:
        opts = {**m.base, m.knobs["batch_size"]: str(size)}
    else:
        return not_run(schedule, "the engine states no batch_size knob")
    engine = m.runner.engine_with(opts)
    m.runner.progress.phase("needle", 1 + size)
    alone = generate(engine, [needle], m.runner.pin.top_k)
    m.runner.progress.advance(1)
    inside = [r for r in generate(engine, batch, m.runner.pin.top_k) if r.id == needle.id]
    m.runner.progress.advance(size)
    reference = _trace(m.runner, alone, "needle alone")
    trace = _trace(m.runner, inside, "needle in a batch")
    part = shard_pin(m.runner.pin, [needle.id])
    against_pin = pin_verdict(compare(part.trace, trace, m.doctrine))
    cell = compare_runs(reference, trace, m.doctrine, schedule, reference_name="needle alone", pin=against_pin)
    return _texts(cell, engine)


def _forced(
    runner: _Runner, opts: Mapping[str, str], baseline: Trace, doctrine: Doctrine, schedule: Schedule
) -> CellResult:
    """Force the engine along the baseline's own tokens, every prompt, and compare."""
    engine = runner.engine_with(opts)
    if not isinstance(engine, ForcesDecode):
        return not_run(schedule, f"the engine gives no forced data: engine {runner.name!r} has no `force` method")
    runner.progress.phase(schedule.cell, len(baseline.records))
    records: list[PromptRecord] = []
    modes: set[str] = set()
    for rec in baseline.records:
        try:
            call = partial(engine.force, rec.prompt_token_ids, rec.token_ids, runner.pin.top_k)
            fd = engine_call(engine, "force", call)
        except ForcedDecodeUnavailable as exc:
            return not_run(schedule, f"the engine gives no forced data: {exc}")
        if len(fd.token_ids) != len(rec.token_ids):
            raise EngineError(
                f"engine {runner.name!r}: force returned {len(fd.token_ids)} choices for {len(rec.token_ids)} "
                f"fed tokens (prompt {rec.id!r})"
            )
        modes.add(fd.mode)
        records.append(forced_record(rec, fd.token_ids, fd.top_logprobs))
        runner.progress.advance()
    knobs = {**schedule.knobs, "force_mode": "/".join(sorted(modes))}
    trace = _trace(runner, records, schedule.cell)
    return _texts(compare_runs(baseline, trace, doctrine, replace(schedule, knobs=knobs)), engine)
