"""The steps of gate's GitHub Action (`action.yml`), as a program that runs anywhere:

    python -m gate.integrations.github_action [--candidate-trace T | --engine E] [...]

Each flag defaults to an environment variable (`GATE_MODEL`, `GATE_ENGINE`,
`GATE_ENGINE_OPTIONS`, `GATE_CANDIDATE_TRACE`, `GATE_STRICT`, `GATE_BASELINE_REPORT`,
`GATE_REPORT_DIR`, `GATE_PINS_DIR`, `GATE_MODEL_PATH`, `GATE_NEAR_TIE_MNATS`): the action
hands its inputs over as environment variables, never spliced into a shell line.

It gates the candidate (a trace, else the engine, through `gating`, the functions of
`gate run`) against the pin of the `model` input, else gate's default model (never the pin
a trace's header names), writes the reports into the report folder (JSON, Markdown, JUnit; the
candidate's trace when an engine ran; the diff against the baseline report when one is
given), appends the Markdown report to `GITHUB_STEP_SUMMARY` once (and the diff's, once),
and writes the outputs to `GITHUB_OUTPUT`: verdict, exit-code, prompts, strict-pass,
ratified-pass, exact-ties, near-ties, defects, summary, report-dir, report-json,
report-markdown, report-junit, candidate-trace, diff-exit, diff-json, diff-markdown.

Nothing is lost: before any work it refuses a baseline or trace where it writes a report,
a report folder that is a file, and a GITHUB_OUTPUT or job summary that is an input or a
report (or, GITHUB_OUTPUT, a folder); the baseline is read before anything is written.
Every line it prints goes through `workflow_commands`, so no text becomes a runner command.

Exit: the gate's (0 pass, 1 fail); 1 also when NEW is worse than the baseline; 2 for bad
input (a baseline of another pin included); 3 for an engine failure; 4 for a bug in gate.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gate.errors import INTERNAL_ERROR_EXIT, GateError, InputError, TraceError
from gate.integrations.workflow_commands import RunnerLog, runner_log, write_outputs

DEFAULT_REPORT_DIR = "gate-reports"
REPORT_JSON = "gate-report.json"
REPORT_MARKDOWN = "gate-report.md"
REPORT_JUNIT = "gate-report.xml"
CANDIDATE_TRACE = "gate-candidate.jsonl"
DIFF_JSON = "gate-diff.json"
DIFF_MARKDOWN = "gate-diff.md"
TRUE = ("1", "true", "yes", "on")
FALSE = ("", "0", "false", "no", "off")


def parse_args(argv: Sequence[str] | None, env: Mapping[str, str]) -> argparse.Namespace:
    def e(name: str) -> str | None:
        return env.get(name) or None

    p = argparse.ArgumentParser(prog="python -m gate.integrations.github_action", description=__doc__)
    p.add_argument("--model", default=e("GATE_MODEL"), help="the pin's model id (default: the trace's, else gate's)")
    p.add_argument("--engine", default=e("GATE_ENGINE"), help="candidate engine name (when no trace is given)")
    p.add_argument(
        "--engine-options", default=env.get("GATE_ENGINE_OPTIONS", ""), help="key=value pairs, space or newline apart"
    )
    p.add_argument("--model-path", default=e("GATE_MODEL_PATH"), help="load the engine's weights from this folder")
    p.add_argument("--candidate-trace", default=e("GATE_CANDIDATE_TRACE"), help="gate this trace (no model runs)")
    p.add_argument("--strict", default=env.get("GATE_STRICT", "false"), help="true: a ratified-only pass fails")
    p.add_argument("--near-tie-mnats", default=e("GATE_NEAR_TIE_MNATS"), help="override the pin's near-tie threshold")
    p.add_argument("--baseline-report", default=e("GATE_BASELINE_REPORT"), help="a JSON report to diff against")
    p.add_argument("--report-dir", default=env.get("GATE_REPORT_DIR") or DEFAULT_REPORT_DIR)
    p.add_argument("--pins-dir", default=e("GATE_PINS_DIR"))
    return p.parse_args(argv)


def flag(value: str, name: str) -> bool:
    v = value.strip().lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise InputError(f"input {name}: expected true or false, found {value!r}")


def engine_options(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        pairs = shlex.split(text)
    except ValueError as exc:
        raise InputError(f"input engine-options: {exc}") from None
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"input engine-options: {pair!r}: expected key=value")
        out[key.strip()] = value
    return out


def report_paths(args: argparse.Namespace) -> dict[str, Path]:
    """Each file the step writes, by its output's name: the reports, the candidate's trace
    when an engine runs, the diff when a baseline is given."""
    folder = Path(args.report_dir)
    paths = {
        "report-json": folder / REPORT_JSON,
        "report-markdown": folder / REPORT_MARKDOWN,
        "report-junit": folder / REPORT_JUNIT,
    }
    if not args.candidate_trace:
        paths["candidate-trace"] = folder / CANDIDATE_TRACE
    if args.baseline_report:
        paths["diff-json"] = folder / DIFF_JSON
        paths["diff-markdown"] = folder / DIFF_MARKDOWN
    return paths


def _same(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """`a` and `b` are one file: by identity where both exist, else by resolved path."""
    from gate.core.storage.atomic import same_file

    return same_file(a, [b]) is not None or os.path.realpath(a) == os.path.realpath(b)


def _inside(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))


def check_runner_files(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    """GITHUB_OUTPUT and GITHUB_STEP_SUMMARY, before any work: each a file (or none yet),
    neither one the step reads (an input, a file under pins-dir or model-path) nor one it
    writes (a report): a report appended into the baseline, or the outputs into a report,
    is a file lost. Exit 2, naming the variable."""
    read = {"candidate-trace": args.candidate_trace, "baseline-report": args.baseline_report}
    folders = {"pins-dir": args.pins_dir, "model-path": args.model_path}
    written = report_paths(args)
    for var in ("GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY"):
        target = env.get(var)
        if not target:
            continue
        if var == "GITHUB_OUTPUT" and os.path.isdir(target):
            raise InputError(f"GITHUB_OUTPUT {target}: is a folder; the runner's outputs file must be a file")
        for name, path in read.items():
            if path and _same(target, path):
                raise InputError(f"{var} {target}: is the input {name}; the step never writes into a file it reads")
        for name, folder in folders.items():
            if folder and _inside(target, folder):
                raise InputError(f"{var} {target}: is inside the input {name} {folder}; the step never writes there")
        for name, path in written.items():
            if _same(target, path):
                raise InputError(f"{var} {target}: is the step's {name} ({path}); each file has one writer")


def check_report_folder(args: argparse.Namespace, paths: Mapping[str, Path]) -> None:
    """The report folder is one (or is made), and no file the step writes there is an input:
    a baseline downloaded where the new report goes would be replaced before the diff reads
    it. Exit 2, before any work."""
    from gate.core.storage.atomic import REPORT, TRACE, check_target

    folder = Path(args.report_dir)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"input report-dir: {folder}: is a file, not a folder")
    read = {"candidate-trace": args.candidate_trace, "baseline-report": args.baseline_report}
    for key, path in paths.items():
        for name, given in read.items():
            if given and _same(given, path):
                raise InputError(
                    f"input {name}: {given} is where the step writes its {key} ({path}): it would be replaced "
                    "before it is read",
                    hint=f"put the {name} in another folder, or give another report-dir",
                )
        check_target(path, TRACE if key == "candidate-trace" else REPORT, force=True, flag=f"output {key}:")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"input report-dir: {folder}: cannot be made: {exc.strerror or exc}") from None


def run(args: argparse.Namespace, env: Mapping[str, str], log: RunnerLog) -> int:
    from gate.core.storage.atomic import atomic_write
    from gate.core.traces.trace import encode_trace
    from gate.core.verdict.diff import parse_report
    from gate.integrations.gating import Overrides, default_model, gate_candidate, gate_engine_named
    from gate.reports import render
    from gate.workflows.run.diff import read_report

    strict = flag(args.strict, "strict")
    try:
        near = float(args.near_tie_mnats) if args.near_tie_mnats is not None else None
    except ValueError:
        raise InputError(f"input near-tie-mnats: expected a number, found {args.near_tie_mnats!r}") from None
    overrides = Overrides(near_tie_mnats=near)
    if args.candidate_trace and args.engine:
        raise InputError("inputs candidate-trace and engine: give one (a trace is gated as it is, no engine runs)")
    baseline = Path(args.baseline_report) if args.baseline_report else None
    if baseline is not None and not baseline.is_file():
        raise InputError(f"input baseline-report: {baseline}: no such file")
    paths = report_paths(args)
    check_report_folder(args, paths)
    # Read before anything is written: what the diff compares is the baseline as it was given.
    base = read_report(baseline) if baseline is not None else None

    # The pin is the one the user names, else the default: never the one a trace's header
    # names (a candidate would choose its own judge); a trace for another model is refused.
    model = args.model or default_model()
    if args.candidate_trace:
        outcome = gate_candidate(
            args.candidate_trace, model=model, pins_dir=args.pins_dir, strict=strict, overrides=overrides
        )
    else:
        outcome = gate_engine_named(
            args.engine or "hf",
            engine_options(args.engine_options),
            model=model,
            model_path=args.model_path,
            pins_dir=args.pins_dir,
            strict=strict,
            overrides=overrides,
        )
    result = outcome.result
    report_json = render(result, "json")
    markdown = render(result, "markdown")
    texts = {"report-json": report_json, "report-markdown": markdown, "report-junit": render(result, "junit")}
    for key, text in texts.items():
        atomic_write(paths[key], text.encode("utf-8"), overwrite=True)
    if "candidate-trace" in paths:
        trace = encode_trace(outcome.candidate.header, outcome.candidate.records)
        atomic_write(paths["candidate-trace"], trace, overwrite=True)
    append_summary(markdown, env, log)
    log.say(result.summary)
    log.say(f"reports written to {args.report_dir}")

    counts = result.counts
    outputs: dict[str, object] = {
        "verdict": result.verdict,
        "exit-code": result.exit_code,
        "prompts": counts["prompts"],
        "strict-pass": counts["strict_pass"],
        "ratified-pass": counts["ratified_pass"],
        "exact-ties": counts["exact_ties"],
        "near-ties": counts["near_ties"],
        "defects": counts["defects"],
        "summary": result.summary,
        "report-dir": args.report_dir,
        **{k: paths[k] for k in texts},
        "candidate-trace": paths.get("candidate-trace", ""),
        "diff-exit": "",
        "diff-json": "",
        "diff-markdown": "",
    }
    code = result.exit_code
    if base is not None:
        import json

        new = parse_report(json.loads(report_json), str(paths["report-json"]))
        code = max(code, _diff(base, new, paths, outputs, env, log))
    write_outputs(outputs, env)
    return code


def _diff(
    base: Any, new: Any, paths: Mapping[str, Path], outputs: dict[str, object], env: Mapping[str, str], log: RunnerLog
) -> int:
    """The diff of this run against the baseline: its reports, summary and outputs; its exit code."""
    from gate.core.storage.atomic import atomic_write
    from gate.core.verdict.diff import diff_reports
    from gate.reports import render

    try:
        diff = diff_reports(base, new)
    except InputError as exc:
        log.error(f"gate diff: {exc}")
        outputs["diff-exit"] = exc.exit_code
        return exc.exit_code
    md = render(diff, "markdown")
    atomic_write(paths["diff-json"], render(diff, "json").encode("utf-8"), overwrite=True)
    atomic_write(paths["diff-markdown"], md.encode("utf-8"), overwrite=True)
    append_summary(md, env, log)
    log.say(diff.summary)
    outputs.update(
        {"diff-exit": diff.exit_code, "diff-json": paths["diff-json"], "diff-markdown": paths["diff-markdown"]}
    )
    return diff.exit_code


def append_summary(markdown: str, env: Mapping[str, str], log: RunnerLog) -> None:
    from gate.core.storage.atomic import append_problem, append_regular

    target = env.get("GITHUB_STEP_SUMMARY")
    if not target:
        return
    problem = append_problem(target)
    if problem is None:
        try:
            append_regular(target, markdown.rstrip("\n") + "\n\n")
        except OSError as exc:
            problem = exc.strerror or str(exc)
    if problem is not None:
        log.say(f"gate: warning: cannot append to GITHUB_STEP_SUMMARY {target}: {problem}")


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    with runner_log(env) as log:
        args = parse_args(argv, env)
        outputs_ok = False
        try:
            check_runner_files(args, env)
            outputs_ok = True
            return run(args, env, log)
        except GateError as exc:
            # A workflow annotation (`::error::`) and the outputs a later step can test.
            # A trace's fault is shown on its line (the file as given, relative to the workspace).
            at = {"file": exc.path, "line": exc.line} if isinstance(exc, TraceError) else {}
            log.error(f"gate: error: {exc}" + (f"\nhint: {exc.hint}" if exc.hint else ""), **at)
            if outputs_ok:
                try:
                    write_outputs({"verdict": "error", "exit-code": exc.exit_code}, env)
                except InputError as more:
                    log.error(f"gate: error: {more}")
            return exc.exit_code
        except OSError as exc:  # a report that cannot be written, a folder that vanished: as atomic_write's
            where = f"{exc.filename}: " if exc.filename else ""
            log.error(f"gate: error: {where}{exc.strerror or exc}")
            return InputError.exit_code
        except Exception as exc:  # a bug in gate: its traceback inside the bracket, one line after
            traceback.print_exc()
            log.error(f"gate: internal error (a bug in gate): {type(exc).__name__}: {exc}")
            return INTERNAL_ERROR_EXIT


if __name__ == "__main__":
    sys.exit(main())
