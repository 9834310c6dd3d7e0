"""The steps of gate's GitHub Action (`action.yml`), as a program that runs anywhere:

    python -m gate.integrations.github_action [--candidate-trace T | --engine E] [...]

Each flag defaults to an environment variable (`GATE_MODEL`, `GATE_ENGINE`,
`GATE_ENGINE_OPTIONS`, `GATE_CANDIDATE_TRACE`, `GATE_STRICT`, `GATE_BASELINE_REPORT`,
`GATE_REPORT_DIR`, `GATE_PINS_DIR`, `GATE_MODEL_PATH`, `GATE_NEAR_TIE_MNATS`): the action
hands its inputs over as environment variables, never spliced into a shell line.

It gates the candidate (a trace, else the engine, through `gating`, the functions of
`gate run`), writes the reports into the report folder (JSON, Markdown, JUnit; the
candidate's trace when an engine ran; the diff against the baseline report when one is
given), appends the Markdown report to `GITHUB_STEP_SUMMARY` once (and the diff's, once),
and writes the outputs to `GITHUB_OUTPUT`: verdict, exit-code, prompts, strict-pass,
ratified-pass, exact-ties, near-ties, defects, summary, report-dir, report-json,
report-markdown, report-junit, candidate-trace, diff-exit, diff-json, diff-markdown.

Exit: the gate's (0 pass, 1 fail); 1 also when NEW is worse than the baseline; 2 for bad
input (a baseline of another pin included); 3 for an engine failure.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from gate.errors import GateError, InputError

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


def write_outputs(values: Mapping[str, object], env: Mapping[str, str]) -> None:
    """`name=value` lines appended to GITHUB_OUTPUT (stdout when it is not set)."""
    lines = []
    for name, value in values.items():
        text = "" if value is None else str(value)
        if "\n" in text:  # one line each: a value never spans lines here, but never trust it
            text = " ".join(text.split())
        lines.append(f"{name}={text}\n")
    target = env.get("GITHUB_OUTPUT")
    if target:
        with open(target, "a", encoding="utf-8") as fh:
            fh.writelines(lines)
    else:
        sys.stdout.writelines(lines)


def append_summary(markdown: str, env: Mapping[str, str]) -> None:
    from gate.core.storage.atomic import append_problem, append_regular

    target = env.get("GITHUB_STEP_SUMMARY")
    if not target:
        return
    problem = append_problem(target)
    if problem is not None:
        print(f"gate: warning: cannot append to GITHUB_STEP_SUMMARY {target}: {problem}", file=sys.stderr)
        return
    try:
        append_regular(target, markdown.rstrip("\n") + "\n\n")
    except OSError as exc:
        print(f"gate: warning: cannot append to GITHUB_STEP_SUMMARY {target}: {exc.strerror or exc}", file=sys.stderr)


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from gate.core.storage.atomic import atomic_write
    from gate.core.traces.trace import encode_trace
    from gate.integrations.gating import Overrides, gate_candidate, gate_engine_named
    from gate.reports import render

    strict = flag(args.strict, "strict")
    try:
        near = float(args.near_tie_mnats) if args.near_tie_mnats is not None else None
    except ValueError:
        raise InputError(f"input near-tie-mnats: expected a number, found {args.near_tie_mnats!r}") from None
    overrides = Overrides(near_tie_mnats=near)
    if args.candidate_trace and args.engine:
        raise InputError("inputs candidate-trace and engine: give one (a trace is gated as it is, no engine runs)")
    folder = Path(args.report_dir)
    folder.mkdir(parents=True, exist_ok=True)
    baseline = Path(args.baseline_report) if args.baseline_report else None
    if baseline is not None and not baseline.is_file():
        raise InputError(f"input baseline-report: {baseline}: no such file")

    if args.candidate_trace:
        outcome = gate_candidate(
            args.candidate_trace, model=args.model, pins_dir=args.pins_dir, strict=strict, overrides=overrides
        )
    else:
        outcome = gate_engine_named(
            args.engine or "hf",
            engine_options(args.engine_options),
            model=args.model,
            model_path=args.model_path,
            pins_dir=args.pins_dir,
            strict=strict,
            overrides=overrides,
        )
    result = outcome.result
    paths = {
        "report-json": folder / REPORT_JSON,
        "report-markdown": folder / REPORT_MARKDOWN,
        "report-junit": folder / REPORT_JUNIT,
    }
    markdown = render(result, "markdown")
    for key, fmt in (("report-json", "json"), ("report-markdown", "markdown"), ("report-junit", "junit")):
        text = markdown if fmt == "markdown" else render(result, fmt)
        atomic_write(paths[key], text.encode("utf-8"), overwrite=True)
    trace_path = None
    if not args.candidate_trace:
        trace_path = folder / CANDIDATE_TRACE
        atomic_write(trace_path, encode_trace(outcome.candidate.header, outcome.candidate.records), overwrite=True)
    append_summary(markdown, env)
    print(result.summary, file=sys.stderr)
    print(f"reports written to {folder}", file=sys.stderr)

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
        "report-dir": folder,
        **{k: v for k, v in paths.items()},
        "candidate-trace": trace_path or "",
        "diff-exit": "",
        "diff-json": "",
        "diff-markdown": "",
    }
    code = result.exit_code
    if baseline is not None:
        diff_code = _diff(baseline, paths["report-json"], folder, outputs, env)
        code = max(code, diff_code)
    write_outputs(outputs, env)
    return code


def _diff(baseline: Path, new: Path, folder: Path, outputs: dict[str, object], env: Mapping[str, str]) -> int:
    """The diff of this run against the baseline: its reports, summary and outputs; its exit code."""
    from gate.core.storage.atomic import atomic_write
    from gate.core.verdict.diff import diff_reports
    from gate.reports import render
    from gate.workflows.diff import read_report

    try:
        diff = diff_reports(read_report(baseline), read_report(new))
    except InputError as exc:
        print(f"::error::gate diff: {exc}", file=sys.stderr)
        outputs["diff-exit"] = exc.exit_code
        return exc.exit_code
    md = render(diff, "markdown")
    atomic_write(folder / DIFF_JSON, render(diff, "json").encode("utf-8"), overwrite=True)
    atomic_write(folder / DIFF_MARKDOWN, md.encode("utf-8"), overwrite=True)
    append_summary(md, env)
    print(diff.summary, file=sys.stderr)
    outputs.update(
        {"diff-exit": diff.exit_code, "diff-json": folder / DIFF_JSON, "diff-markdown": folder / DIFF_MARKDOWN}
    )
    return diff.exit_code


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    try:
        args = parse_args(argv, env)
        return run(args, env)
    except GateError as exc:
        # A workflow annotation (`::error::`) and the outputs a later step can test.
        print(f"::error::gate: error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        write_outputs({"verdict": "error", "exit-code": exc.exit_code}, env)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
