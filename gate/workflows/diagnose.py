"""`gate diagnose`: from a position of a failed gate to the layer and part where the bug enters.

The context is the prompt plus the oracle's tokens before the position. It is fed to three
engines through the path the divergence came from (a free-run or forced-decode position:
the decode path, a prefill over the prompt then one token at a time through the KV cache;
a position read from a prefill, `forced_mode` "prefill": one prefill over the context):
- the reference, transformers in float32 on the same weights;
- the honest engine, transformers in the candidate's working dtype (bfloat16), whose error
  against the reference at each point is that point's honest band;
- the candidate, captured through its capability protocol (gate.core.engine): `capture_path`
  through either path (the built-in hf, llamacpp and vllm engines), or `capture_activations`,
  one pass over the context (the prefill path only; a plugin's simplest way in).
The other path is run too where the candidate has it, to say which of the two shows the deviation.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from gate.core.diagnosis.capture import DECODE, PATHS, PREFILL, Capture, Tensor, point_of_module
from gate.core.diagnosis.locate import compare_path
from gate.core.diagnosis.metric import MARGIN, METRIC
from gate.core.diagnosis.record import Diagnosis
from gate.core.engine import CapturesActivations, CapturesPaths
from gate.core.verdict.result import DEFECT, FORCED, GateResult
from gate.errors import EngineError, InputError

if TYPE_CHECKING:
    from gate.core.pins.pin import Pin

GIVEN = "given"  # the source of a position named on the command line
# (prompt ids, context ids, path) -> the capture
Capturer = Callable[[Sequence[int], Sequence[int], str], Capture]


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
        close = ", ".join(list(records)[:5])
        raise InputError(f"--prompt {prompt_id!r}: the pin of {pin.model} has no such prompt (first ids: {close})")
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


def diagnose(
    target: Target,
    candidate: Capturer,
    reference: Capturer,
    honest: Capturer,
    *,
    margin: float = MARGIN,
    both_paths: bool = True,
    engines: dict[str, Any] | None = None,
    model: str = "",
    notes: Sequence[str] = (),
) -> Diagnosis:
    """Capture the three engines on the target's path (and the other path) and locate."""
    findings = {}
    layer_count = 0
    for path in (target.path, other(target.path)) if both_paths else (target.path,):
        ref = reference(target.prompt_ids, target.context_ids, path)
        hon = honest(target.prompt_ids, target.context_ids, path)
        cand = candidate(target.prompt_ids, target.context_ids, path)
        layer_count = ref.layer_count
        findings[path] = compare_path(ref, hon, cand, margin=margin)
        del ref, hon, cand  # a capture of a large model is large: one path at a time
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
ACTIVATIONS_KIND = "activations"  # `CapturesActivations`: one pass over the context


def capture_kind(engine: object) -> str | None:
    """How `gate diagnose` captures an engine (a class, checked before it loads, or a loaded
    one): by the capability protocols it implements, a plugin exactly as a built-in."""
    if isinstance(engine, CapturesPaths):
        return PATHS_KIND
    if isinstance(engine, CapturesActivations):
        return ACTIVATIONS_KIND
    return None


def check_capturable(cls: type, name: str) -> None:
    """Refuse, before an engine loads, one that gate diagnose cannot capture."""
    if capture_kind(cls) is None:
        raise InputError(
            f"gate diagnose cannot capture engine {name!r}: it implements neither capture_activations nor "
            "capture_path (gate.engine.CapturesActivations; built in: hf and engines built on HFEngine, "
            "llamacpp, vllm); docs/guides/diagnose.md says what ortgenai would need"
        )


def capture_target(engine: object, target: Target) -> tuple[Target, tuple[str, ...]]:
    """The target as the engine can be captured, and a note when that changed it: an engine
    with `capture_activations` only computes one pass over the context, the prefill path."""
    if capture_kind(engine) != ACTIVATIONS_KIND:
        return target, ()
    note = (
        "the candidate is captured through its capture_activations (one pass over the context): the prefill path only"
    )
    return replace(target, path=PREFILL), (note,)


def capturer_for(engine: Any) -> Capturer:
    """The capture of a loaded candidate engine, through its capability protocol."""
    kind = capture_kind(engine)
    if kind == PATHS_KIND:
        return lambda p, c, path: engine.capture_path(p, c, path)
    if kind == ACTIVATIONS_KIND:
        return lambda p, c, path: capture_from_activations(engine, c, path)
    check_capturable(type(engine), str(getattr(engine, "name", type(engine).__name__)))
    raise AssertionError("unreachable")


def capture_from_activations(engine: CapturesActivations, context_ids: Sequence[int], path: str) -> Capture:
    """A `CapturesActivations` engine's answer as a capture: each module name it returns that
    names one of gate's points, its rows checked ([positions, features], one per position)."""
    if path != PREFILL:
        raise InputError(f"an engine captured through capture_activations has the prefill path only, not {path}")
    name = str(getattr(engine, "name", type(engine).__name__))
    answer = engine.capture_activations(list(context_ids))
    if not isinstance(answer, Mapping):
        raise EngineError(f"engine {name!r}: capture_activations returned {type(answer).__name__}, not a mapping")
    n = len(context_ids)
    layer_count = 1 + max((int(m.group(1)) for k in answer for m in [_RESIDUAL.search(str(k))] if m), default=-1)
    tensors = []
    for module, raw in answer.items():
        point = point_of_module(str(module), layer_count)
        if point is None:
            continue
        values = np.asarray(raw, dtype=np.float32)
        if values.ndim != 2 or values.shape[0] != n:
            raise EngineError(
                f"engine {name!r}: capture_activations[{module!r}] has shape {tuple(values.shape)}; "
                f"expected [{n} positions, features]"
            )
        tensors.append(Tensor(point, tuple(range(n)), values))
    meta = {"engine": name, "class": type(engine).__name__, "capture": "capture_activations"}
    return Capture(path=PREFILL, context_length=n, tensors=tuple(tensors), meta=meta)


_RESIDUAL = re.compile(r"(?:^|\.)layers\.(\d+)$")


@contextmanager
def reference_engines(model_path: str, *, honest_dtype: str = "bfloat16") -> Iterator[tuple[Any, Any]]:
    """(reference, honest): transformers float32 and `honest_dtype` on the same weights."""
    from gate.engines.hf.engine import HFEngine

    ref = HFEngine(model_path, dtype="float32")
    hon: HFEngine | None = None
    try:
        hon = HFEngine(model_path, dtype=honest_dtype)
        yield ref, hon
    finally:
        ref.close()
        if hon is not None:
            hon.close()


def diagnose_engine(
    engine: Any,
    target: Target,
    model_path: str,
    *,
    honest_dtype: str = "bfloat16",
    margin: float = MARGIN,
    model: str = "",
    notes: Sequence[str] = (),
) -> Diagnosis:
    """Diagnose a loaded candidate engine at `target`, reference and band from `model_path`."""
    from gate.engines.hf.capture import capture_hf

    candidate = capturer_for(engine)
    target, capture_notes = capture_target(engine, target)
    both_paths = capture_kind(engine) == PATHS_KIND
    with reference_engines(model_path, honest_dtype=honest_dtype) as (ref, hon):
        engines = {
            "candidate": _describe(engine),
            "reference": _describe(ref),
            "honest": _describe(hon),
        }
        return diagnose(
            target,
            candidate,
            lambda p, c, path: capture_hf(ref, p, c, path),
            lambda p, c, path: capture_hf(hon, p, c, path),
            margin=margin,
            both_paths=both_paths,
            engines=engines,
            model=model,
            notes=(*notes, *(n for n in capture_notes if n not in notes)),
        )


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
