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
    from gate.workflows.diagnose.request import DiagnoseRequest


def run_diagnose(*, request: DiagnoseRequest, report: options.ReportTarget) -> int:
    if request.emit_context is not None or request.candidate_activations is not None:
        return run_diagnose_activations(request=request, report=report)
    from gate.cli.common import progress_display
    from gate.cli.output import emit, pin_inputs, refuse_overwrite, say
    from gate.reports import check_format
    from gate.workflows.diagnose.request import diagnose_request

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
    """`--emit-context FILE` and `--candidate-activations FILE` (gate.workflows.diagnose.request)."""
    import orjson

    from gate.cli.output import emit, pin_inputs, refuse_overwrite, say, write_data
    from gate.reports import check_format
    from gate.workflows.diagnose.request import EmittedContext, diagnose_activations

    fmt = report.fmt

    def claim_output(model_files: tuple[Path, ...]) -> None:
        nonlocal fmt
        inputs: tuple[Path | None, ...] = (*model_files, *pin_inputs(request.pin_model(), request.pins_dir))
        if request.emit_context is not None:
            refuse_overwrite(report.force, (request.emit_context, "--emit-context"), inputs=inputs)
        else:
            fmt = check_format("Diagnosis", report.fmt)
            inputs = (request.candidate_activations, *inputs)
            refuse_overwrite(report.force, (report.output, "--output"), inputs=inputs)

    out = diagnose_activations(request, claim_output=claim_output, say=say)
    if isinstance(out, EmittedContext):
        data = orjson.dumps(out.context.to_dict(), option=orjson.OPT_INDENT_2) + b"\n"
        write_data(data, out.file, force=report.force)
        say(
            f"{out.file}: {len(out.target.context_ids)} context tokens and {len(out.context.modules)} module names "
            "to dump (docs/reference/activation-dump.md)"
        )
        return 0
    emit(out, fmt, report.output, force=report.force, engine_ran=True)
    return out.exit_code


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
    with the run's own model, engine, options, weights and pins; for a failure by the
    distribution with no defect (a diffuse one), the command that reruns the gate and ranks
    where the error grows, and what to read in it. None where there is none, or where that
    command could not run: gate diagnose captures only some engines, and a hint whose
    command exits 2 is no help."""
    from gate.core.verdict.result import DEFECT, FAIL
    from gate.engines.registry import resolve
    from gate.errors import GateError
    from gate.workflows.diagnose.core import capture_kind

    if result.verdict != FAIL:
        return None
    try:
        capturable = capture_kind(resolve(engine)) is not None
    except GateError:
        capturable = False
    if not capturable:
        return None
    words = ["gate", "diagnose", "--model", model, "--engine", engine]
    for opt in engine_opts or ():
        words += ["--engine-opt", opt]
    if model_path is not None:
        words += ["--model-path", str(model_path)]
    if pins_dir is not None:
        words += ["--pins-dir", str(pins_dir)]
    dist = result.distribution
    diffuse = dist is not None and (dist.beyond or dist.disagrees)
    if diffuse and not any(x.cls == DEFECT for x in result.divergences):
        return (
            "the gate failed by its distribution with no defect: the failure is diffuse, a small error spread over "
            f"many positions; {shlex.join(words)} reruns the gate, diagnoses the position its failure points to "
            "(the largest KL when the distribution failed it) and ranks the largest excursions on both paths, "
            "under the location threshold too: a part that leads in every layer (an MLP or a norm scaled, an "
            "accumulation in a narrower dtype) is where to look, and a larger decode path than prefill path "
            "points at the KV cache"
        )
    if not result.divergences:
        return None
    order = {p.id: i for i, p in enumerate(result.prompts)}
    d = min(result.divergences, key=lambda x: (x.cls != DEFECT, order.get(x.prompt_id, 1 << 30), x.position))
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
        every_decode_step: Annotated[
            bool,
            typer.Option(
                "--every-decode-step",
                help="Capture the decode path through a decode step per context token, as the engine's own loop "
                "ran, not a prefill and the position's one step: slower; it sees a cache bug that shows only "
                "from a later step.",
            ),
        ] = False,
    ) -> None:
        """Locate where a failure enters: the layer, the part and the path (exit 0 nothing located, 1 located)."""
        from gate.workflows.common.requests import EngineRequest
        from gate.workflows.diagnose.request import DiagnoseRequest

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
            every_decode_step=every_decode_step,
        )
        raise typer.Exit(run_diagnose(request=request, report=options.ReportTarget(fmt.value, output, force)))
