"""`gate diagnose`: the layer, part and path where a failed gate's first defect enters.

Exit codes: 0 nothing leaves the honest band (or nothing diverged), 1 a point leaves it
(the report names the first), 2 bad input, 3 engine failure.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gate.cli import options

if TYPE_CHECKING:
    from gate.core.verdict.result import GateResult
    from gate.workflows.diagnose_request import DiagnoseRequest


def run_diagnose(*, request: DiagnoseRequest, report: options.ReportTarget) -> int:
    if request.emit_context is not None or request.candidate_activations is not None:
        return run_diagnose_activations(request=request, report=report)
    from gate.cli.common import progress_display
    from gate.cli.output import emit, pin_inputs, refuse_overwrite, say
    from gate.reports import check_format
    from gate.workflows.diagnose_request import diagnose_request

    fmt = check_format("Diagnosis", report.fmt)
    refuse_overwrite(
        report.force, (report.output, "--output"), inputs=pin_inputs(request.pin_model(), request.pins_dir)
    )
    diagnosis = diagnose_request(request, say=say, display=progress_display)
    if diagnosis is None:
        return 0
    emit(diagnosis, fmt, report.output, force=report.force, engine_ran=True)
    return diagnosis.exit_code


def run_diagnose_activations(*, request: DiagnoseRequest, report: options.ReportTarget) -> int:
    """`--emit-context FILE` (the context and modules an engine gate does not drive is to
    dump) and `--candidate-activations FILE` (its dump, diagnosed like a built-in engine)."""
    import orjson

    from gate.cli.output import emit, refuse_overwrite, say, write_data
    from gate.core.pins.pin import load_pin
    from gate.errors import InputError
    from gate.models.default import resolve_model_path
    from gate.reports import check_format
    from gate.workflows.activations import check_dump, dump_candidate, dump_target, load_dump
    from gate.workflows.activations import emit_context as context_of
    from gate.workflows.diagnose import diagnose_candidate, target_given

    emit_context, candidate_activations = request.emit_context, request.candidate_activations
    prompt, position, path = request.prompt, request.position, request.path
    fmt, output, force = report.fmt, report.output, report.force
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
        refuse_overwrite(force, (emit_context, "--emit-context"))
        target = target_given(pin, prompt, position, path or "decode")
        context = context_of(pin, target, weights)
        write_data(orjson.dumps(context.to_dict(), option=orjson.OPT_INDENT_2) + b"\n", emit_context, force=force)
        say(
            f"{emit_context}: {len(target.context_ids)} context tokens and {len(context.modules)} module names to "
            "dump (docs/reference/activation-dump.md)"
        )
        return 0
    assert candidate_activations is not None
    fmt = check_format("Diagnosis", fmt)
    refuse_overwrite(force, (output, "--output"), inputs=(candidate_activations,))
    arrays, meta = load_dump(candidate_activations)
    where = str(candidate_activations)
    target = dump_target(pin, meta, where, prompt=prompt, position=position, path=path)
    check_dump(arrays, target, where)
    say(f"diagnosing {where} at prompt {target.prompt_id} position {target.position} ({target.path} path)")
    described = {"name": meta.get("engine", "activations dump"), "class": "dump", "file": where}
    if "dtype" in meta:
        described["dtype"] = meta["dtype"]
    diagnosis = diagnose_candidate(
        dump_candidate(arrays, where), described, target, weights, honest_dtype=request.honest_dtype, model=pin.model
    )
    emit(diagnosis, fmt, output, force=force, engine_ran=True)
    return diagnosis.exit_code


def diagnose_hint(
    result: GateResult,
    *,
    model: str,
    engine: str,
    engine_opts: list[str] | None,
    model_path: Path | None = None,
    pins_dir: Path | None = None,
) -> str | None:
    """The `gate diagnose` command for a failed result's first defect (else first divergence),
    with the run's own model, engine, options, weights and pins; None where there is none, or
    where that command could not run: gate diagnose captures only some engines, and a hint
    whose command exits 2 is no help."""
    from gate.core.verdict.result import DEFECT, FAIL
    from gate.engines.registry import resolve
    from gate.errors import GateError
    from gate.workflows.diagnose import capture_kind

    if result.verdict != FAIL or not result.divergences:
        return None
    try:
        capturable = capture_kind(resolve(engine)) is not None
    except GateError:
        capturable = False
    if not capturable:
        return None
    order = {p.id: i for i, p in enumerate(result.prompts)}
    d = min(result.divergences, key=lambda x: (x.cls != DEFECT, order.get(x.prompt_id, 1 << 30), x.position))
    words = ["gate", "diagnose", "--model", model, "--engine", engine]
    for opt in engine_opts or ():
        words += ["--engine-opt", opt]
    if model_path is not None:
        words += ["--model-path", str(model_path)]
    if pins_dir is not None:
        words += ["--pins-dir", str(pins_dir)]
    words += ["--prompt", d.prompt_id, "--position", str(d.position)]
    if d.source == "forced" and d.forced_mode == "prefill":
        words += ["--path", "prefill"]
    what = "first defect" if d.cls == DEFECT else f"first divergence ({d.cls.replace('_', ' ')})"
    return (
        f"the {what} is prompt {d.prompt_id}, position {d.position}; "
        f"to find the layer and part it enters at: {shlex.join(words)}"
    )


def register(app: typer.Typer) -> None:
    @app.command("diagnose", epilog=options.EXIT_CODES_DIAGNOSE)
    def diagnose_cmd(
        model: options.Model = None,
        engine: options.Engine = None,
        engine_opt: options.EngineOpt = None,
        model_path: options.ModelPath = None,
        prompt: Annotated[
            str | None, typer.Option("--prompt", help="Diagnose this prompt id (with --position), diverged or not.")
        ] = None,
        position: Annotated[
            int | None, typer.Option("--position", help="The oracle position (0-based) to diagnose.")
        ] = None,
        path: Annotated[
            str | None,
            typer.Option("--path", help="With --prompt/--position: prefill or decode \\[default: decode]."),
        ] = None,
        reference_model: Annotated[
            Path | None,
            typer.Option(
                "--reference-model",
                help="The transformers weights of the reference and the honest band \\[default: the candidate's "
                "own for hf engines, else the pin's model].",
            ),
        ] = None,
        honest_dtype: Annotated[
            str, typer.Option("--honest-dtype", help="The honest engine's dtype (the band).")
        ] = "bfloat16",
        fmt: options.DiagnosisFormatOpt = options.DiagnosisFormat.rich,
        output: options.Output = None,
        pins_dir: options.PinsDir = None,
        force: options.Force = False,
        emit_context: Annotated[
            Path | None,
            typer.Option(
                "--emit-context",
                help="With --prompt/--position: write the context (token ids) and the module names an engine "
                "gate does not drive is to dump, as JSON (docs/reference/activation-dump.md), and stop.",
            ),
        ] = None,
        candidate_activations: Annotated[
            Path | None,
            typer.Option(
                "--candidate-activations",
                help="Diagnose a safetensors dump of an engine's own activations over the emitted context.",
            ),
        ] = None,
    ) -> None:
        """Locate where a failure enters: the layer, the part and the path (exit 0 nothing located, 1 located)."""
        from gate.workflows.diagnose_request import DiagnoseRequest
        from gate.workflows.requests import EngineRequest

        request = DiagnoseRequest(
            model=model,
            engine=EngineRequest(engine, tuple(engine_opt or ()), model_path),
            reference_model=reference_model,
            prompt=prompt,
            position=position,
            path=path,
            honest_dtype=honest_dtype,
            pins_dir=pins_dir,
            emit_context=emit_context,
            candidate_activations=candidate_activations,
        )
        raise typer.Exit(run_diagnose(request=request, report=options.ReportTarget(fmt.value, output, force)))
