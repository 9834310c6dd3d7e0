"""`gate diagnose` end to end on a tiny pinned model: `gate run` fails with a planted bug and
prints the diagnose command for its first defect; that command, and `gate diagnose` without
--prompt/--position, locate the bug; an honest engine is located nowhere; bad input is exit 2."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from helpers.gate_cli import invoke

pytestmark = pytest.mark.slow

BUG = ["--engine", "helpers.planted_engines:AttentionBug", "--engine-opt", "layer=1"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Path]]:
    from helpers.tiny_pin import MODEL, build_tiny_pin, one_thread

    with one_thread():
        weights, pins = build_tiny_pin(tmp_path_factory.mktemp("diagnose-pin"))
        yield MODEL, weights, pins


def base(tiny: tuple[str, Path, Path]) -> list[str]:
    model, weights, pins = tiny
    return ["--model", model, "--model-path", str(weights), "--pins-dir", str(pins)]


def test_gate_run_prints_the_diagnose_command_and_it_locates_the_bug(tiny: tuple[str, Path, Path]) -> None:
    r = invoke(["run", *base(tiny), *BUG, "--format", "json"])
    assert r.exit_code == 1, r.stderr
    report = orjson.loads(r.stdout)
    defects = [d for d in report["divergences"] if d["class"] == "defect"]
    first = defects[0]
    hint = next(line for line in r.stderr.splitlines() if "gate diagnose" in line)
    assert f"prompt {first['prompt_id']}, position {first['position']}" in hint
    command = shlex.split(hint.split(": ", 1)[1])
    assert command[:2] == ["gate", "diagnose"] and "--model-path" in command and "layer=1" in command
    r = invoke([*command[1:], "--format", "json"])
    assert r.exit_code == 1, r.stderr
    d = orjson.loads(r.stdout)
    assert (d["first_divergent_layer"], d["first_divergent_part"], d["path"]) == (1, "attention", "decode")
    assert (d["prompt_id"], d["position"], d["source"]) == (first["prompt_id"], first["position"], "given")


def test_diagnose_without_a_position_diagnoses_the_first_defect(tiny: tuple[str, Path, Path]) -> None:
    r = invoke(["diagnose", *base(tiny), *BUG, "--format", "json"])
    assert r.exit_code == 1, r.stderr
    d = orjson.loads(r.stdout)
    assert d["gate_diagnosis"] == 1 and d["divergence_class"] == "defect"
    assert d["source"] in ("free_run", "forced")
    assert (d["first_divergent_layer"], d["first_divergent_part"]) == (1, "attention")
    assert "enters at layer 1, attention, decode path" in r.stderr  # the summary line


def test_an_honest_engine_is_located_nowhere_and_html_draws_it(tiny: tuple[str, Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "d.html"
    args = ["diagnose", *base(tiny), "--prompt", "p03", "--position", "5", "--format", "html", "--output", str(out)]
    r = invoke(args)
    assert r.exit_code == 0, r.stderr
    page = out.read_text()
    assert page.count("<svg") == 2 and "nothing leaves the honest band" in page
    assert invoke(args).exit_code == 2  # never overwritten without --force
    r = invoke(["diagnose", *base(tiny), "--prompt", "p03", "--position", "5"])
    assert r.exit_code == 0 and "nothing leaves the honest band" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt", "p03"], "--prompt and --position go together"),
        (["--prompt", "nope", "--position", "1"], "no such prompt"),
        (["--prompt", "p03", "--position", "999"], "--position 999"),
        (["--path", "prefill"], "--path goes with --prompt"),
        (["--prompt", "p03", "--position", "1", "--path", "sideways"], "expected prefill or decode"),
        (["--format", "markdown"], "'markdown' is not one of"),
        (["--engine", "openai"], "cannot capture engine 'openai'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tiny: tuple[str, Path, Path], args: list[str], message: str) -> None:
    r = invoke(["diagnose", *base(tiny), *args])
    assert r.exit_code == 2, r.output
    assert message in r.stderr
