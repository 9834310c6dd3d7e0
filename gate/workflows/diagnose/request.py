"""`gate diagnose` as one request: the target found (named on the command line, or the
first defect of a gate run first), the candidate loaded, and `gate.workflows.diagnose.core`
run on it against the reference weights; or, for an engine gate does not drive, its context
emitted and its dump of activations diagnosed (`diagnose_activations`).

No printing: what the person should read goes to `say`, the progress to `display`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from gate.core.diagnosis.dump import ActivationContext
from gate.core.diagnosis.record import Diagnosis
from gate.core.pins.pin import doctrine_for, load_pin
from gate.errors import InputError
from gate.workflows.common.engine_calls import open_engine
from gate.workflows.common.requests import EngineRequest, ProgressDisplay, Say, default_model, no_progress, silent
from gate.workflows.diagnose.core import (
    Target,
    capture_target,
    check_capturable,
    diagnose_candidate,
    diagnose_engine,
    target_given,
)
from gate.workflows.diagnose.failure import failure_of
from gate.workflows.run.core import RunPlan, gate_run


@dataclass(frozen=True, slots=True)
class DiagnoseRequest:
    """Everything `gate diagnose` was asked."""

    model: str | None = None
    engine: EngineRequest = field(default_factory=EngineRequest)
    reference_model: Path | None = None
    prompt: str | None = None
    position: int | None = None
    path: str | None = None
    honest_dtype: str = "bfloat16"
    pins_dir: Path | None = None
    emit_context: Path | None = None  # write the context an engine gate does not drive is to dump
    candidate_activations: Path | None = None  # that engine's dump, diagnosed
    every_decode_step: bool = False  # the decode path through every step, not one after a prefill

    def pin_model(self) -> str:
        return self.model or default_model()


def diagnose_request(
    request: DiagnoseRequest, *, say: Say = silent, display: ProgressDisplay = no_progress
) -> Diagnosis | None:
    """The diagnosis, or None when the candidate's tokens match the oracle's everywhere."""
    from gate.engines.registry import resolve
    from gate.models.default import resolve_model_path

    prompt, position, path = request.prompt, request.position, request.path
    if (prompt is None) != (position is None):
        raise InputError("--prompt and --position go together (or neither: diagnose the gate's first defect)")
    if path is not None and prompt is None:
        raise InputError("--path goes with --prompt/--position (a divergence's own path is found from the gate)")
    opts = request.engine.options()
    pin = load_pin(request.pin_model(), request.pins_dir)
    name = request.engine.name()
    target = None
    if prompt is not None and position is not None:  # checked before any engine is imported
        target = target_given(pin, prompt, position, path or "decode")
    check_capturable(resolve(name), name)
    notes: list[str] = []
    failure = None
    with open_engine(request.engine.loader(pin, opts, name), name) as cand:
        if target is None:
            say("running the gate to find the first defect (--prompt/--position skip this)")
            with display() as progress:
                outcome = gate_run(cand, pin, doctrine_for(pin, strict=False), RunPlan(), progress=progress)
            say(f"gate: {outcome.result.verdict}: {outcome.result.summary}")
            target, failure = failure_of(pin, outcome.result, outcome.candidate)
            if target is None:
                say("gate diagnose: the candidate's tokens match the oracle's everywhere: nothing to diagnose")
                return None
            if failure is not None:
                say(f"the gate points to prompt {target.prompt_id} position {target.position}: {failure.chosen}")
        if request.reference_model is not None:
            weights = str(request.reference_model)
        else:  # the very weights an hf or vllm candidate loaded; the pin's model for a GGUF
            weights = getattr(cand, "model_path", None) or resolve_model_path(pin.model)
        target, capture_notes = capture_target(cand, target)
        notes.extend(capture_notes)
        say(f"diagnosing prompt {target.prompt_id} position {target.position} ({target.path} path)")
        diagnosis = diagnose_engine(
            cand,
            target,
            str(weights),
            honest_dtype=request.honest_dtype,
            model=pin.model,
            notes=notes,
            every_step=request.every_decode_step,
        )
        return diagnosis if failure is None else replace(diagnosis, gate_failure=failure)


@dataclass(frozen=True, slots=True)
class EmittedContext:
    """`--emit-context FILE`: the context and module names to write there (the caller writes)."""

    file: Path
    target: Target
    context: ActivationContext


def diagnose_activations(
    request: DiagnoseRequest,
    *,
    claim_output: Callable[[tuple[Path, ...]], None] = lambda inputs: None,
    say: Say = silent,
) -> EmittedContext | Diagnosis:
    """`--emit-context FILE` (the context, and the modules an engine gate does not drive is
    to dump) or `--candidate-activations FILE` (its dump, diagnosed like a built-in engine).
    `claim_output(inputs)` is called once the request is checked and before any work, with
    the files of the reference model's folder (inputs, never written over, --force or not):
    the caller refuses there a file it would write over."""
    from gate.models.default import resolve_model_path
    from gate.workflows.diagnose.activations import check_dump, dump_candidate, dump_target, load_dump
    from gate.workflows.diagnose.activations import emit_context as context_of

    emit_context, candidate_activations = request.emit_context, request.candidate_activations
    prompt, position, path = request.prompt, request.position, request.path
    if emit_context is not None and candidate_activations is not None:
        raise InputError("--emit-context and --candidate-activations are two steps: one at a time")
    flag = "--emit-context" if emit_context is not None else "--candidate-activations"
    engine = request.engine
    for given, name in (
        (engine.engine, "--engine"),
        (engine.engine_opts, "--engine-opt"),
        (engine.model_path, "--model-path"),
    ):
        if given:
            raise InputError(f"{name} goes with a candidate engine; {flag} needs none (reference: --reference-model)")
    pin = load_pin(request.pin_model(), request.pins_dir)
    weights = str(request.reference_model) if request.reference_model is not None else resolve_model_path(pin.model)
    if emit_context is not None:
        if prompt is None or position is None:
            raise InputError("--emit-context needs --prompt and --position: the position whose context to run")
        claim_output(folder_files(weights))
        target = target_given(pin, prompt, position, path or "decode")
        return EmittedContext(emit_context, target, context_of(pin, target, weights))
    if candidate_activations is None:
        raise InputError("--emit-context or --candidate-activations: neither was given")
    claim_output(folder_files(weights))
    arrays, meta = load_dump(candidate_activations)
    where = str(candidate_activations)
    target = dump_target(pin, meta, where, prompt=prompt, position=position, path=path)
    check_dump(arrays, target, where)
    say(f"diagnosing {where} at prompt {target.prompt_id} position {target.position} ({target.path} path)")
    described = {"name": meta.get("engine", "activations dump"), "class": "dump", "file": where}
    if "dtype" in meta:
        described["dtype"] = meta["dtype"]
    return diagnose_candidate(
        dump_candidate(arrays, where), described, target, weights, honest_dtype=request.honest_dtype, model=pin.model
    )


MAX_FOLDER_FILES = 100_000


def folder_files(model: str) -> tuple[Path, ...]:
    """The files of a model folder (none for a model id that is not a folder), bounded."""
    folder = Path(model)
    if not folder.is_dir():
        return ()
    out: list[Path] = []
    for path in folder.rglob("*"):
        if path.is_file():
            out.append(path)
            if len(out) >= MAX_FOLDER_FILES:
                break
    return tuple(out)
