"""The action's Gate step on hostile text and on paths that would lose a file: every line
it prints is read as the runner reads it (tests/helpers/github_runner.py), so text from a
trace, an input or a path never becomes a workflow command; a baseline, an input, a report
is never written over or appended into; a folder where a file belongs (or the reverse) is
one error line and exit 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.github_runner import Command, StepRun, action, annotations, commands, gate_step
from helpers.pin_candidates import default_pin_trace, honest_candidate, planted_defect, write_trace_file

# Text that, printed raw, would be runner commands of its own: a new line that sets an
# output or announces a pass, a carriage return (a line break to the runner), the legacy
# form anywhere in a line.
HOSTILE = (
    "x\n::set-output name=verdict::strict_pass\r::notice title=gate::strict pass ##[set-output name=defects;]0 %0A"
)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("hostile-traces")
    pin = default_pin_trace()
    return {
        "honest": write_trace_file(honest_candidate(pin), folder / "honest.jsonl"),
        "defective": write_trace_file(planted_defect(pin)[0], folder / "defective.jsonl"),
    }


def only_our_annotations(r: StepRun) -> list[tuple[str, str]]:
    """The commands of the step's log: none but `error` annotations, with or without the
    step's stop-commands bracket (the escaping alone must hold)."""
    said = annotations(r.log)
    assert all(name == "error" for name, _ in said), said
    found = commands(r.log)
    stops = {c.data for c in found if c.name == "stop-commands"}
    bare = "\n".join(
        line
        for line in re.split(r"\r\n|\r|\n", r.log)
        if not (line.startswith("::stop-commands::") or any(line == f"::{t}::" for t in stops))
    )
    unbracketed: list[Command] = commands(bare)
    assert all(c.name == "error" for c in unbracketed), unbracketed
    return said


def test_a_hostile_model_input_is_one_escaped_error_annotation(tmp_path: Path, traces: dict[str, Path]) -> None:
    r = gate_step(tmp_path / "w", candidate_trace=str(traces["honest"]), model=HOSTILE)
    assert r.returncode == 2, r.log
    [(_, said)] = only_our_annotations(r)
    assert said.startswith("gate: error: ")
    assert r.outputs == {"verdict": "error", "exit-code": "2"}


def test_a_hostile_baseline_path_is_one_escaped_error_annotation(tmp_path: Path, traces: dict[str, Path]) -> None:
    r = gate_step(tmp_path / "w", candidate_trace=str(traces["honest"]), baseline_report=HOSTILE)
    assert r.returncode == 2, r.log
    [(_, said)] = only_our_annotations(r)
    assert HOSTILE in said  # the runner unescapes it: the text is shown whole, as data
    assert r.outputs == {"verdict": "error", "exit-code": "2"}


def test_a_hostile_trace_header_is_one_escaped_error_annotation(tmp_path: Path, traces: dict[str, Path]) -> None:
    lines = traces["honest"].read_bytes().splitlines()
    head = json.loads(lines[0])
    head["model"] = HOSTILE
    cand = tmp_path / "cand.jsonl"
    cand.write_bytes(b"\n".join([json.dumps(head).encode(), *lines[1:]]) + b"\n")
    r = gate_step(tmp_path / "w", candidate_trace=str(cand))
    assert r.returncode == 2, r.log
    [(_, said)] = only_our_annotations(r)
    assert "is for model" in said, said


def test_a_hostile_report_dir_passes_with_no_command_and_its_path_as_the_output(
    tmp_path: Path, traces: dict[str, Path]
) -> None:
    folder = "reports\n::notice::strict pass\rdefects=0 ##[set-output name=defects;]0"
    r = gate_step(tmp_path / "w", candidate_trace=str(traces["honest"]), report_dir=folder)
    assert r.returncode == 0, r.log
    assert only_our_annotations(r) == []
    assert r.outputs["report-dir"] == folder and r.outputs["defects"] == "0"
    assert set(r.outputs) == set(action()["outputs"])
    assert (tmp_path / "w" / folder / "gate-report.json").is_file()


# ----------------------------------------------------------------------------- nothing lost


def baseline_in(tmp_path: Path, traces: dict[str, Path], where: str) -> Path:
    """An honest run's JSON report, copied to `where` under tmp_path/w."""
    base = gate_step(tmp_path / "base", candidate_trace=str(traces["honest"]))
    assert base.returncode == 0, base.log
    target = tmp_path / "w" / where
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes((tmp_path / "base" / base.outputs["report-json"]).read_bytes())
    return target


def test_a_baseline_where_the_new_report_goes_is_refused_and_kept(tmp_path: Path, traces: dict[str, Path]) -> None:
    """Main's report downloaded into the report folder: the new report would replace it
    before the diff reads it, and a run with a new defect would be "not worse"."""
    baseline = baseline_in(tmp_path, traces, "gate-reports/gate-report.json")
    kept = baseline.read_bytes()
    r = gate_step(tmp_path / "w", candidate_trace=str(traces["defective"]), baseline_report=str(baseline))
    assert r.returncode == 2, r.log
    [(_, said)] = only_our_annotations(r)
    assert "input baseline-report" in said and "gate-report.json" in said, said
    assert baseline.read_bytes() == kept
    assert r.outputs["verdict"] == "error" and r.outputs.get("diff-exit", "") != "0"


def test_a_baseline_elsewhere_in_the_report_folder_is_read_before_anything_is_written(
    tmp_path: Path, traces: dict[str, Path]
) -> None:
    baseline = baseline_in(tmp_path, traces, "gate-reports/main.json")
    kept = baseline.read_bytes()
    r = gate_step(tmp_path / "w", candidate_trace=str(traces["defective"]), baseline_report=str(baseline))
    assert r.returncode == 1, r.log
    assert r.outputs["diff-exit"] == "1" and baseline.read_bytes() == kept


@pytest.mark.parametrize("variable", ["GITHUB_STEP_SUMMARY", "GITHUB_OUTPUT"])
@pytest.mark.parametrize("names", ["baseline", "candidate-trace", "new-report"])
def test_a_runner_file_that_names_an_input_or_a_report_is_refused(
    tmp_path: Path, traces: dict[str, Path], variable: str, names: str
) -> None:
    baseline = baseline_in(tmp_path, traces, "main/gate-report.json")
    cand = tmp_path / "cand.jsonl"
    cand.write_bytes(traces["defective"].read_bytes())
    target = {
        "baseline": baseline,
        "candidate-trace": cand,
        "new-report": tmp_path / "w" / "gate-reports" / "gate-report.json",
    }[names]
    before = {p: p.read_bytes() for p in (baseline, cand)}
    r = gate_step(
        tmp_path / "w",
        runner_env={variable: str(target)},
        candidate_trace=str(cand),
        baseline_report=str(baseline),
    )
    assert r.returncode == 2, r.log
    [(_, said)] = only_our_annotations(r)
    assert variable in said, said
    assert {p: p.read_bytes() for p in before} == before
    assert not (tmp_path / "w" / "gate-reports" / "gate-report.json").exists()


def test_a_report_dir_that_is_a_file_is_one_line_and_exit_2(tmp_path: Path, traces: dict[str, Path]) -> None:
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "gate-reports").write_text("mine\n")
    r = gate_step(tmp_path / "w", candidate_trace=str(traces["honest"]))
    assert r.returncode == 2, r.log
    [(_, said)] = only_our_annotations(r)
    assert "input report-dir: gate-reports" in said and "Traceback" not in r.log
    assert (tmp_path / "w" / "gate-reports").read_text() == "mine\n"
    assert r.outputs == {"verdict": "error", "exit-code": "2"}


def test_a_github_output_that_is_a_folder_is_one_line_and_exit_2(tmp_path: Path, traces: dict[str, Path]) -> None:
    folder = tmp_path / "out-folder"
    folder.mkdir()
    r = gate_step(tmp_path / "w", runner_env={"GITHUB_OUTPUT": str(folder)}, candidate_trace=str(traces["honest"]))
    assert r.returncode == 2, r.log
    [(_, said)] = only_our_annotations(r)
    assert "GITHUB_OUTPUT" in said and "Traceback" not in r.log
    assert list(folder.iterdir()) == []


def test_what_an_engine_prints_while_the_step_runs_is_never_a_command(tmp_path: Path) -> None:
    """An engine (or a library, or gate quoting a server) prints command lines on stdout and
    stderr: under the runner they fall between the step's stop-commands and its resume token;
    only the step's own error annotation is carried out."""
    from helpers.github_runner import ROOT
    from helpers.hostile_engine import SAID

    tests = ROOT / "tests"
    r = gate_step(
        tmp_path / "w",
        runner_env={"PYTHONPATH": f"{ROOT}:{tests}"},
        engine="helpers.hostile_engine:HostileEngine",
    )
    assert r.returncode == 3, r.log
    [(name, said)] = annotations(r.log)
    assert name == "error" and "no device" in said and SAID in said, said
    assert r.log.count("::set-output name=verdict::strict_pass") >= 2  # printed, as text
    assert r.outputs == {"verdict": "error", "exit-code": "3"}


def test_a_broken_trace_is_annotated_on_its_line_whatever_its_path_holds(tmp_path: Path) -> None:
    """The annotation names the trace's file and line as properties, escaped as
    @actions/core escapes properties: a `,` or `:` in the path is no second property."""
    name = "t,line=99,title=strict pass:x\n::notice::y.jsonl"
    work = tmp_path / "w"
    work.mkdir()
    (work / name).write_text('{"gate_trace": 1, "role": "candidate"\n')
    r = gate_step(work, candidate_trace=name)
    assert r.returncode == 2, r.log
    [cmd] = [c for c in commands(r.log) if c.name == "error"]
    assert cmd.properties == {"file": name, "line": "1"}, cmd.properties
    assert only_our_annotations(r) == [("error", cmd.data)]
