"""The `gate_check` fixture in a foreign project's test suite: a tiny test file run by
pytester (in process) and by pytest from a folder outside the repository with only the
built wheel installed. The candidates are the default pin's own oracle trace (honest) and
the same with a defect planted far from any tie (tests/helpers/pin_candidates.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from helpers.pin_candidates import default_pin_trace, honest_candidate, planted_defect, planted_flip, write_trace_file
from helpers.wheel_site import build_wheel_site

pytest_plugins = ["pytester"]

PLUGIN = "gate.integrations.pytest_plugin"

FOREIGN_TESTS = """
HONEST = {honest!r}
DEFECTIVE = {defective!r}


def test_honest_engine(gate_check):
    result = gate_check(HONEST)
    assert result.verdict == "strict_pass"


def test_defective_engine(gate_check):
    gate_check(DEFECTIVE)
"""


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("pin-candidates")
    pin = default_pin_trace()
    defective, prompt_id, position = planted_defect(pin)
    return {
        "honest": write_trace_file(honest_candidate(pin), folder / "honest.jsonl"),
        "defective": write_trace_file(defective, folder / "defective.jsonl"),
        "flipped": write_trace_file(planted_flip(pin), folder / "flipped.jsonl"),
        "prompt_id": prompt_id,
        "position": position,
    }


def plugin_args() -> list[str]:
    """`-p` the plugin unless this environment's installed gate already registers it."""
    installed = any(ep.value == PLUGIN for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", PLUGIN]


def foreign_tests(traces: dict[str, object]) -> str:
    return FOREIGN_TESTS.format(honest=str(traces["honest"]), defective=str(traces["defective"]))


def test_honest_passes_and_defective_fails_with_the_summary_and_reason(
    pytester: pytest.Pytester, traces: dict[str, object]
) -> None:
    pytester.makepyfile(test_foreign=foreign_tests(traces))
    r = pytester.runpytest(*plugin_args(), "-p", "no:cacheprovider")
    r.assert_outcomes(passed=1, failed=1)
    out = r.stdout.str()
    assert "40/41 prompts strict, 1248/1249 positions; 40/41 ratified (0 exact ties, 0 near ties, 1 defect)" in out
    where = f"first defect at prompt {traces['prompt_id']!r} position {traces['position']}"
    assert where in out, out
    assert "Traceback" not in out and "gate_check(DEFECTIVE)" not in out  # pytrace=False: the message only


def test_the_report_dir_option_writes_json_and_markdown_per_test(
    pytester: pytest.Pytester, traces: dict[str, object]
) -> None:
    pytester.makepyfile(test_foreign=foreign_tests(traces))
    r = pytester.runpytest(*plugin_args(), "-p", "no:cacheprovider", "--gate-report-dir", "reports")
    r.assert_outcomes(passed=1, failed=1)
    folder = pytester.path / "reports"
    names = sorted(p.name for p in folder.iterdir())
    assert names == [
        "test_foreign.py_test_defective_engine.json",
        "test_foreign.py_test_defective_engine.md",
        "test_foreign.py_test_honest_engine.json",
        "test_foreign.py_test_honest_engine.md",
    ]
    bad = json.loads((folder / "test_foreign.py_test_defective_engine.json").read_text())
    assert bad["verdict"] == "fail" and bad["counts"]["defects"] == 1
    assert json.loads((folder / "test_foreign.py_test_honest_engine.json").read_text())["verdict"] == "strict_pass"
    assert "gate: fail" in (folder / "test_foreign.py_test_defective_engine.md").read_text()
    r.stdout.fnmatch_lines(["*full report: *test_foreign.py_test_defective_engine.json*", "gate: 4 report file(s)*"])


def test_the_ini_option_names_the_report_dir(pytester: pytest.Pytester, traces: dict[str, object]) -> None:
    pytester.makepyfile(test_foreign=foreign_tests(traces))
    pytester.makeini("[pytest]\ngate_report_dir = ini-reports\n")
    r = pytester.runpytest(*plugin_args(), "-p", "no:cacheprovider", "-k", "honest")
    r.assert_outcomes(passed=1)
    assert (pytester.path / "ini-reports" / "test_foreign.py_test_honest_engine.json").is_file()


def test_strict_and_the_threshold_reach_the_doctrine(pytester: pytest.Pytester, traces: dict[str, object]) -> None:
    # A threshold above the planted gap makes the flip a near tie: ratified, a pass;
    # strict then refuses the ratified-only pass. (The candidate reports its lists and
    # forced data: the pin's floor judges only a candidate that does.)
    pytester.makepyfile(
        test_foreign=f"""
DEFECTIVE = {str(traces["flipped"])!r}

def test_default(gate_check):
    gate_check(DEFECTIVE)

def test_lenient(gate_check):
    result = gate_check(DEFECTIVE, near_tie_mnats=100000.0, no_evidence=True)
    assert result.verdict == "ratified_pass"

def test_strict(gate_check):
    gate_check(DEFECTIVE, near_tie_mnats=100000.0, no_evidence=True, strict=True)
"""
    )
    r = pytester.runpytest(*plugin_args(), "-p", "no:cacheprovider")
    r.assert_outcomes(passed=1, failed=2)
    r.stdout.fnmatch_lines(["*ratified pass under strict: 1 prompt(s) diverge only by ties*"])
    r.stdout.fnmatch_lines(["*40/41 ratified (0 exact ties, 0 near ties, 1 defect)*"])


def test_an_engine_object_of_the_plugin_contract(pytester: pytest.Pytester, traces: dict[str, object]) -> None:
    # The plugin example (tests/plugin_example) is a complete engine that replays a trace:
    # gate drives it (free run; it has no forced decode) exactly as `gate run --engine echo`.
    example = Path(__file__).resolve().parents[1] / "plugin_example"
    pytester.makepyfile(
        test_foreign=f"""
import sys
sys.path.insert(0, {str(example)!r})
from gate_echo_engine import EchoEngine

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"

def test_honest_engine(gate_check):
    result = gate_check(EchoEngine(MODEL, trace={str(traces["honest"])!r}))
    assert result.verdict == "strict_pass" and result.candidate_engine == "echo"

def test_defective_engine(gate_check):
    gate_check(EchoEngine(MODEL, trace={str(traces["defective"])!r}))
"""
    )
    r = pytester.runpytest(*plugin_args(), "-p", "no:cacheprovider")
    r.assert_outcomes(passed=1, failed=1)
    r.stdout.fnmatch_lines([f"*first defect at prompt {traces['prompt_id']!r} position {traces['position']}*"])


def test_bad_input_fails_the_test_with_one_message(pytester: pytest.Pytester, tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    pytester.makepyfile(
        test_foreign=f"""
def test_missing(gate_check):
    gate_check({str(missing)!r})

def test_not_a_candidate(gate_check):
    gate_check(42)
"""
    )
    r = pytester.runpytest(*plugin_args(), "-p", "no:cacheprovider")
    r.assert_outcomes(failed=2)
    out = r.stdout.str()
    assert f"gate: error: {missing}" in out
    assert "the candidate is a int: expected a candidate trace" in out
    assert "Traceback" not in out


def test_the_plugin_module_imports_nothing_heavy() -> None:
    code = (
        f"import sys, {PLUGIN}; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'orjson', 'rich', 'typer', 'torch') "
        "or m.startswith(('gate.core', 'gate.workflows', 'gate.reports', 'gate.engines'))))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", r.stdout


def test_a_foreign_project_with_only_the_wheel_installed(
    tmp_path_factory: pytest.TempPathFactory, traces: dict[str, object]
) -> None:
    site = build_wheel_site(tmp_path_factory.mktemp("wheel"))
    project = tmp_path_factory.mktemp("foreign-project")
    (project / "test_foreign.py").write_text(foreign_tests(traces))
    env = {k: v for k, v in os.environ.items() if k not in ("GATE_PINS_DIR", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--gate-report-dir", "out"],
        cwd=project,
        env={**env, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 failed, 1 passed" in r.stdout, r.stdout
    assert "40/41 prompts strict" in r.stdout
    assert f"first defect at prompt {traces['prompt_id']!r}" in r.stdout
    # The fixture came from the wheel's entry point and the pin from its package data.
    shown = json.loads((project / "out" / "test_foreign.py_test_honest_engine.json").read_text())
    assert shown["verdict"] == "strict_pass"
