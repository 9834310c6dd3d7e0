"""`gate diagnose`: from a position of a failed gate to the layer and part where the bug enters.

The context is the prompt plus the oracle's tokens before the position. It is fed to three
engines through the path the divergence came from (a free-run or forced-decode position:
the decode path, a prefill over the context before its last token, then that token through
the KV cache, the decode step the position's token comes from; a position read from a
prefill, `forced_mode` "prefill": one prefill over the context):
- the reference, transformers in float32 on the same weights;
- the honest engine, transformers in the candidate's working dtype (bfloat16), whose error
  against the reference at each point is that point's honest band;
- the candidate, captured through its capability protocol (gate.core.engine): `capture_path`
  through either path (the built-in hf, llamacpp and vllm engines), or its own named
  activations: an engine with `capture_activations` (`CapturesActivations`: one pass over the
  context, the prefill path) or a dump file (gate.workflows.diagnose.activations); both are checked by
  one function (gate.core.diagnosis.dump.named_capture).
The other path is run too (for a built-in capture), to say which of the two shows the deviation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from gate.core.diagnosis.capture import DECODE, PATHS, PREFILL, Capture
from gate.core.diagnosis.dump import named_capture
from gate.core.diagnosis.locate import HonestBand, compare_path, honest_band
from gate.core.diagnosis.metric import MARGIN, METRIC
from gate.core.diagnosis.record import Diagnosis
from gate.core.engine import CapturesActivations, CapturesPaths
from gate.core.verdict.result import DEFECT, FORCED, GateResult
from gate.errors import EngineError, GateError, InputError
from gate.text import did_you_mean

if TYPE_CHECKING:
    from gate.core.pins.pin import Pin
    from gate.engines.registry import ReferenceEngine

GIVEN = "given"  # the source of a position named on the command line
# (prompt ids, context ids, path) -> the capture
Capturer = Callable[[Sequence[int], Sequence[int], str], Capture]
# (prompt ids, context ids, path) -> the honest engine's capture, or its band already taken
HonestSource = Callable[[Sequence[int], Sequence[int], str], Capture | HonestBand]


@dataclass(slots=True)
class Timings:
    """Wall and CPU seconds spent in each phase of a diagnosis (scripts/bench_diagnose.py
    prints them)."""

    seconds: dict[str, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            self.cpu_seconds[name] = self.cpu_seconds.get(name, 0.0) + time.process_time() - start_cpu


@dataclass(frozen=True, slots=True)
class NamedActivations:
    """A candidate that hands gate its activations by module name (a dump file, or a plugin's
    `capture_activations`): `fetch(context ids, module names)` returns the arrays, checked
    against the reference's capture of the same context; `error` is what a malformed array is
    (InputError for a file, EngineError for an engine)."""

    fetch: Callable[[Sequence[int], Sequence[str]], Mapping[str, Any]]
    where: str
    error: type[GateError] = InputError


@dataclass(frozen=True, slots=True)
class Target:
    """The position to diagnose, its context and the path it came from."""

    prompt_id: str
    position: int
    source: str
    path: str
    prompt_ids: tuple[int, ...]
    context_ids: tuple[int, ...]
    divergence_class: str | None = None


def target_given(pin: Pin, prompt_id: str, position: int, path: str = DECODE) -> Target:
    """`--prompt ID --position N`: that position of the pinned oracle, diverged or not."""
    if path not in PATHS:
        raise InputError(f"--path {path!r}: expected prefill or decode")
    records = {r.id: r for r in pin.trace.records}
    rec = records.get(prompt_id)
    if rec is None:
        close = did_you_mean(prompt_id, records) or f" Its first ids: {', '.join(list(records)[:5])}."
        raise InputError(f"--prompt {prompt_id!r}: the pin of {pin.model} has no such prompt.{close}")
    n = len(rec.token_ids)
    if not 0 <= position < n:
        raise InputError(f"--position {position}: prompt {prompt_id!r} has oracle positions 0..{n - 1}")
    return Target(
        prompt_id=prompt_id,
        position=position,
        source=GIVEN,
        path=path,
        prompt_ids=tuple(rec.prompt_token_ids),
        context_ids=tuple(rec.prompt_token_ids) + tuple(rec.token_ids[:position]),
    )


def path_of(source: str, forced_mode: str | None) -> str:
    """A forced position read from a prefill came through the prefill path; free-run and
    forced-decode positions through the decode path."""
    return PREFILL if source == FORCED and forced_mode == PREFILL else DECODE


def target_of_result(pin: Pin, result: GateResult) -> Target | None:
    """The first defect of the gate's result (prompt order, then position), else its first
    divergence; None when nothing diverged."""
    if not result.divergences:
        return None
    order = {r.id: i for i, r in enumerate(pin.trace.records)}
    ranked = sorted(result.divergences, key=lambda d: (d.cls != DEFECT, order.get(d.prompt_id, 1 << 30), d.position))
    d = ranked[0]
    t = target_given(pin, d.prompt_id, d.position, path_of(d.source, d.forced_mode))
    return Target(t.prompt_id, t.position, d.source, t.path, t.prompt_ids, t.context_ids, d.cls)


def other(path: str) -> str:
    return PREFILL if path == DECODE else DECODE


def decode_prompt(target: Target, every_step: bool = False) -> tuple[int, ...]:
    """What the decode path prefills: the context before the position's last token, so that
    the one decode step captured is the step the position's token comes from (the step where
    a decode-path bug shows), not a forward per oracle token (a bf16 decode step costs
    nearly a whole prefill of the context on an AMX CPU: docs/results/diagnose-cost.md). At
    position 0 the context is the prompt, and its token comes from the prefill. With
    `every_step` (`--every-decode-step`): the prompt, then a decode step per context token,
    as the engine's own loop ran (slower; it sees a cache bug that shows from a later step)."""
    if every_step:
        return tuple(target.prompt_ids)
    return target.context_ids[: max(len(target.prompt_ids), len(target.context_ids) - 1)]


def decode_note(target: Target) -> str:
    before = len(decode_prompt(target))
    return (
        f"the decode path: a prefill over the {before} context tokens before the position's last one, "
        "then the decode step that reads it (the step the position's token comes from)"
    )


def diagnose(
    target: Target,
    candidate: Capturer | NamedActivations,
    reference: Capturer,
    honest: HonestSource,
    *,
    margin: float = MARGIN,
    both_paths: bool = True,
    engines: dict[str, Any] | None = None,
    model: str = "",
    notes: Sequence[str] = (),
    timings: Timings | None = None,
    every_step: bool = False,
) -> Diagnosis:
    """Capture the three engines on the target's path (and the other path) and locate. Named
    activations are one capture, compared on the target's path only. An engine's decode path
    is captured from `decode_prompt`: a prefill over the context before its last token, then
    the one decode step of the position (a note in the diagnosis says so); named activations
    are compared with every decode step of the reference's and the honest engine's."""
    findings = {}
    layer_count = 0
    clock = timings or Timings()
    named = isinstance(candidate, NamedActivations)
    for path in (target.path, other(target.path)) if both_paths and not named else (target.path,):
        # A dump or a plugin's activations hold every step of the engine's own decode loop:
        # their band is the honest engine's decode path over every step too.
        prompt_ids = decode_prompt(target, every_step) if path == DECODE and not named else target.prompt_ids
        with clock.phase("reference capture"):
            ref = reference(prompt_ids, target.context_ids, path)
        with clock.phase("honest capture"):
            hon = honest(prompt_ids, target.context_ids, path)
        with clock.phase("candidate capture"):
            if isinstance(candidate, NamedActivations):
                names = [t.point.module for t in ref.tensors]
                arrays = candidate.fetch(target.context_ids, names)
                cand = named_capture(arrays, ref, candidate.where, error=candidate.error)
            else:
                cand = candidate(prompt_ids, target.context_ids, path)
        layer_count = ref.layer_count
        with clock.phase("comparison"):
            findings[path] = compare_path(ref, hon, cand, margin=margin)
        del ref, hon, cand  # a capture of a large model is large: one path at a time
    if DECODE in findings and not named and len(decode_prompt(target, every_step)) > len(target.prompt_ids):
        notes = (*notes, decode_note(target))
    return Diagnosis(
        prompt_id=target.prompt_id,
        position=target.position,
        source=target.source,
        path=target.path,
        finding=findings[target.path],
        other=findings.get(other(target.path)),
        margin=margin,
        metric=METRIC,
        prompt_length=len(target.prompt_ids),
        context_length=len(target.context_ids),
        layer_count=layer_count,
        divergence_class=target.divergence_class,
        engines=dict(engines or {}),
        model=model,
        notes=tuple(notes),
    )


PATHS_KIND = "paths"  # `CapturesPaths`: the engine captures through either path
NAMED_KIND = "named"  # `CapturesActivations`: its own named activations, one pass over the context


def capture_kind(engine: object) -> str | None:
    """How `gate diagnose` captures an engine (a class, checked before it loads, or a loaded
    one): by the capability protocols it implements, a plugin exactly as a built-in."""
    if isinstance(engine, CapturesPaths):
        return PATHS_KIND
    if isinstance(engine, CapturesActivations):
        return NAMED_KIND
    return None


def check_capturable(cls: type, name: str) -> None:
    """Refuse, before an engine loads, one that gate diagnose cannot capture."""
    if capture_kind(cls) is None:
        raise InputError(
            f"gate diagnose cannot capture engine {name!r}: it captures hf (and engines built on HFEngine), "
            "llamacpp, vllm, mlx, executorch (its layers) and any engine with capture_activations; for another "
            "engine, write its activations to a file (--emit-context, then --candidate-activations: "
            "docs/reference/activation-dump.md)"
        )


def capture_target(engine: object, target: Target) -> tuple[Target, tuple[str, ...]]:
    """The target as the engine can be captured, and a note when that changed it: an engine
    with `capture_activations` only computes one pass over the context, the prefill path."""
    if capture_kind(engine) != NAMED_KIND:
        return target, ()
    note = (
        "the candidate is captured through its capture_activations (one pass over the context): the prefill path only"
    )
    return replace(target, path=PREFILL), (note,)


def capturer_for(engine: Any) -> Capturer | NamedActivations:
    """The capture adapter for a loaded candidate engine."""
    kind = capture_kind(engine)
    if kind == NAMED_KIND:
        where = f"engine {getattr(engine, 'name', type(engine).__name__)!r} capture_activations"
        from gate.workflows.common.engine_calls import engine_call

        def fetch(ids: Sequence[int], names: Sequence[str]) -> Mapping[str, Any]:
            call = lambda: engine.capture_activations(list(ids), list(names))  # noqa: E731
            return engine_call(engine, "capture_activations", call)

        return NamedActivations(fetch, where, EngineError)
    if kind == PATHS_KIND:
        return lambda p, c, path: engine.capture_path(p, c, path)
    check_capturable(type(engine), str(getattr(engine, "name", type(engine).__name__)))
    raise AssertionError("unreachable")


@contextmanager
def reference_engines(
    model_path: str, *, honest_dtype: str = "bfloat16", timings: Timings | None = None
) -> Iterator[tuple[Any, Any]]:
    """(reference, honest): transformers float32 and `honest_dtype` on the same weights."""
    clock = timings or Timings()
    with clock.phase("load reference and honest"):
        ref = load_hf(model_path, "float32")
    hon: Any = None
    try:
        with clock.phase("load reference and honest"):
            hon = load_hf(model_path, honest_dtype)
        yield ref, hon
    finally:
        ref.close()
        if hon is not None:
            hon.close()


class DiagnoseOptions(TypedDict, total=False):
    """`diagnose_candidate`'s keyword options, as `diagnose_engine` passes them on."""

    honest_dtype: str
    margin: float
    model: str
    notes: Sequence[str]
    timings: Timings | None
    cache: bool
    every_step: bool


def diagnose_engine(engine: Any, target: Target, model_path: str, **options: Unpack[DiagnoseOptions]) -> Diagnosis:
    """Diagnose a loaded candidate engine at `target`, reference and band from `model_path`."""
    return diagnose_candidate(capturer_for(engine), _describe(engine), target, model_path, lender=engine, **options)


@contextmanager
def heap_frozen() -> Iterator[None]:
    """Python's cyclic collector kept to the objects made inside: those that exist before (a
    loaded model's modules, transformers', torch's and numpy's own) are frozen (`gc.freeze`)
    and given back to it after. A diagnosis makes enough objects to trigger a full collection
    now and then, and a full collection of a process holding a model scans all of them (0.18
    s on the Qwen3.6 test checkpoint, 20 of its prefills); its own garbage is still collected.
    A caller's freeze is left alone."""
    import gc

    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def diagnose_candidate(
    candidate: Capturer | NamedActivations,
    described: dict[str, Any],
    target: Target,
    model_path: str,
    *,
    honest_dtype: str = "bfloat16",
    margin: float = MARGIN,
    model: str = "",
    notes: Sequence[str] = (),
    timings: Timings | None = None,
    cache: bool = True,
    every_step: bool = False,
    lender: Any = None,
) -> Diagnosis:
    """Diagnose a candidate (a capture adapter, or named activations) at `target`, the
    reference and the band from `model_path`; the honest engine on `lender`'s loaded weights
    (the candidate engine) where they are the checkpoint's bit for bit (gate.engines.hf.borrow).

    The reference is captured once, by one float32 prefill over the context with the logits
    of every position a candidate's lm_head may bring, and stands for both paths: float32's
    own decode path differs from its prefill by rounding far below the band's floor (4.6e-6
    relative at worst on the default model against BAND_FLOOR's 3.9e-3;
    tests/workflows/test_diagnose_reference_once.py), while its decode path costs a forward
    per context token. With `cache`, the reference and the honest band are read from gate's
    cache when an earlier diagnosis computed them from the same inputs
    (gate.workflows.diagnose.cache), and kept there when computed. The objects that exist before
    it are out of the cyclic collector's sight while it runs (`heap_frozen`)."""
    with heap_frozen():  # a full collection of a process with a model loaded: 0.18 s
        from gate.workflows.diagnose import cache as diagnose_cache

        clock = timings or Timings()
        named = isinstance(candidate, NamedActivations)
        paths = (target.path,) if named else (target.path, other(target.path))
        stepped = target.prompt_ids if named else decode_prompt(target, every_step)
        # lm_head's rows: every position's for named activations (a dump's lm_head has them all);
        # for an engine's own paths, from the decode path's last prompt position on (its prefill
        # keeps that row, the prefill path's is the last).
        logits_from = 0 if named else len(stepped) - 1
        key, kept = None, None
        if cache:
            with clock.phase("cache"):
                ids = (target.prompt_ids, target.context_ids)
                key = diagnose_cache.manifest(model_path, honest_dtype, *ids, sorted(paths), stepped, logits_from)
                kept = diagnose_cache.read(key) if key is not None else None
        if kept is not None:
            reference, bands, engines = kept.reference, dict(kept.bands), dict(kept.engines)
            notes = (*notes, "the reference and the honest band: from gate's cache (the same weights and context)")
        else:
            computed = reference_and_band(target, model_path, honest_dtype, paths, stepped, logits_from, clock, lender)
            reference, bands, engines = computed
            if engines["honest"].get("weights") == LENT:
                notes = (
                    *notes,
                    "the honest engine and the reference: on the candidate's loaded weights, "
                    "the checkpoint's bit for bit (not loaded again)",
                )
        out = diagnose(
            target,
            candidate,
            lambda p, c, path: as_path(reference, path),
            lambda p, c, path: bands[path],
            margin=margin,
            engines={"candidate": described, **engines},
            model=model,
            notes=notes,
            timings=clock,
            every_step=every_step,
        )
        if kept is None and key is not None:
            with clock.phase("cache"), suppress(OSError):  # a cache that cannot be written is no cache
                diagnose_cache.write(key, diagnose_cache.Entry(reference, bands, engines))
        return out


def load_hf(model_path: str, dtype: str, lender: Any = None) -> ReferenceEngine:
    """A reference or honest engine: the registry's reference engine (transformers) on
    `model_path` in `dtype`, no tokenizer, its routers untouched (a diagnosis reads no
    routing record: the record's hooks would only cost every forward a sort per router);
    with `lender` (an engine), on its loaded weights where they are the checkpoint's."""
    from gate.engines.registry import load_reference

    lent = {"lender": lender} if lender is not None else {}
    return load_reference(model_path, tokenizer=False, dtype=dtype, record_routing=False, **lent)


LENT = "the candidate's (the checkpoint's bit for bit)"  # an honest engine's `weights` when lent


def reference_and_band(
    target: Target,
    model_path: str,
    honest_dtype: str,
    paths: Sequence[str],
    stepped: Sequence[int],
    logits_from: int,
    clock: Timings,
    lender: Any = None,
) -> tuple[Capture, dict[str, HonestBand], dict[str, Any]]:
    """The reference capture (one float32 prefill over the context, standing for both paths),
    the honest band of each path and the two engines' descriptions, computed from one load
    of the weights where that is exact: the honest engine captures first, then its weights
    are widened to float32 for the reference (`CapturesReference.widen`, layer by layer as
    it runs); else the reference is loaded on its own. The honest engine is built around
    `lender`'s parameters where they are the checkpoint's (the HF engine's `lender` option),
    else loaded. Neither engine outlives this call."""
    context = target.context_ids
    with clock.phase("load reference and honest"):
        engine = load_hf(model_path, honest_dtype, lender)
        lent = bool(getattr(engine, "borrowed", False))
    try:
        with clock.phase("honest capture"):
            if set(paths) == {PREFILL, DECODE}:
                honest = engine.capture_paths_shared(stepped, context, logits_from=logits_from)
            else:
                (path,) = paths
                prompt = stepped if path == DECODE else target.prompt_ids
                rows = logits_from if path == PREFILL else None
                honest = {path: engine.capture_path(prompt, context, path, logits_from=rows)}
        honest_engine = _describe(engine) | ({"weights": LENT} if lent else {})
        with clock.phase("load reference and honest"):
            if engine.widens_exactly():
                engine.widen()
            else:
                engine.close()
                engine, lent = load_hf(model_path, "float32"), False
        with clock.phase("reference capture"):
            reference = engine.capture_path(target.prompt_ids, context, PREFILL, logits_from=logits_from)
        engines = {
            "reference": _describe(engine) | ({"weights": LENT} if lent else {}),
            "honest": honest_engine,
        }
    finally:
        engine.close()
    with clock.phase("honest capture"):
        bands = {path: honest_band(as_path(reference, path), honest.pop(path)) for path in paths}
    return reference, bands, engines


def as_path(capture: Capture, path: str) -> Capture:
    """The capture said to be of `path` (the reference's one prefill stands for both)."""
    return Capture(path, capture.context_length, capture.tensors, capture.meta)


def _describe(engine: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": getattr(engine, "name", type(engine).__name__), "class": type(engine).__name__}
    for key in ("dtype", "attn_implementation"):
        value = getattr(engine, key, None)
        if value is not None:
            out[key] = str(value).removeprefix("torch.")
    options = getattr(engine, "options", None)
    if isinstance(options, dict):
        out["options"] = {k: v for k, v in options.items() if v is not None}
    return out
