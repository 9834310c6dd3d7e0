"""Every command follows one output rule (gate/cli/output.py):
- stdout carries the data and nothing else, or nothing when `--output FILE` takes it;
- `-o -` means stdout;
- stderr carries what is for a person: a command that only reads files and prints its
  report on stdout prints nothing else (`2>&1 | jq` parses); one that drove an engine ends
  stderr with the summary line; a report written to a file is announced there with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.gate_cli import TOY_MODEL, invoke, record_toy_pin, register_fake
from helpers.trace_builders import SEED_CANDIDATE, SEED_ORACLE

SEED = [str(SEED_ORACLE), str(SEED_CANDIDATE)]


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    register_fake(monkeypatch)
    pins = tmp_path / "pins"
    record_toy_pin(pins)
    where = ["--model", TOY_MODEL, "--pins-dir", str(pins)]
    goldens = ["goldens", "record", *where, "--goldens-dir", str(tmp_path / "goldens"), "--engine", "fake"]
    assert invoke(goldens).exit_code == 0
    return {"pins": pins, "where": where, "goldens_dir": str(tmp_path / "goldens"), "tmp": tmp_path}


def _selftest(monkeypatch: pytest.MonkeyPatch, toy: dict[str, Any]) -> list[str]:
    """`gate selftest` over the fake engine: the run itself is replaced by a canned result
    (the mutants need torch and a real model), the output path is the command's own."""
    pytest.importorskip("torch")
    import gate.engines.hf.mutants as mutants
    import gate.workflows.calibration.selftest as selftest
    from gate.core.calibration.selftest import SelfTestResult, Verdict
    from gate.core.verdict.doctrine import Doctrine

    verdict = Verdict("strict_pass", "all strict", {}, {}, None)
    canned = SelfTestResult("toy/model", "fake 1", Doctrine(), 6, 72, 0, verdict, (), 0.1)
    monkeypatch.setattr(mutants, "mutations", lambda *a, **k: [])
    monkeypatch.setattr(mutants, "baseline_loader", lambda *a, **k: None)
    monkeypatch.setattr(selftest, "run_selftest", lambda *a, **k: canned)
    return ["selftest", *toy["where"]]


# (command line, JSON on stdout is data; drove an engine)
def _commands(toy: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[list[str], bool]]:
    where = toy["where"]
    shard = toy["tmp"] / "shard.jsonl"
    r = invoke(["run", *where, "--engine", "fake", "--save-trace", str(shard), "--format", "json"])
    assert r.exit_code == 0, r.output
    bf16 = ["--dtype", "bfloat16"]  # the toy pin's dtype has no grid
    return {
        "compare": (["compare", *SEED], False),
        "calibrate (files)": (["calibrate", str(toy["pins"] / TOY_MODEL / "pin.jsonl"), str(shard), *bf16], False),
        "run": (["run", *where, "--engine", "fake"], True),
        "run --candidate-trace": (["run", *where, "--candidate-trace", str(shard)], False),
        "goldens check": (["goldens", "check", *where, "--goldens-dir", toy["goldens_dir"], "--engine", "fake"], True),
        "selftest": (_selftest(monkeypatch, toy), True),
    }


def test_every_report_command_follows_the_rule(toy: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, (argv, engine_ran) in _commands(toy, monkeypatch).items():
        r = invoke([*argv, "--format", "json"])
        assert r.exit_code in (0, 1), (name, r.output)
        data = json.loads(r.stdout)  # stdout is exactly one JSON document
        if engine_ran:
            assert r.stderr.rstrip("\n").endswith(data["summary"]), (name, r.stderr)
        else:
            assert r.stderr == "", (name, r.stderr)  # nothing beside the report
        dash = invoke([*argv, "--format", "json", "-o", "-"])
        assert dash.exit_code == r.exit_code, (name, dash.output)
        assert json.loads(dash.stdout).keys() == data.keys(), name  # `-o -` is stdout
        out = toy["tmp"] / f"{name.replace(' ', '_')}.json"
        f = invoke([*argv, "--format", "json", "--output", str(out)])
        assert f.exit_code == r.exit_code, (name, f.output)
        assert f.stdout == "", name  # the data went to the file
        json.loads(out.read_text())
        assert f"report written to {out}" in f.stderr, name
        again = invoke([*argv, "--format", "json", "--output", str(out)])
        assert again.exit_code == 2 and "already exists; pass --force" in again.stderr, name


def test_data_commands_write_data_only_on_stdout(toy: dict[str, Any]) -> None:
    where = toy["where"]
    shown = invoke(["pin", "show", *where])
    assert shown.exit_code == 0 and shown.stderr == ""
    assert json.loads(shown.stdout)["model"] == TOY_MODEL
    prompts = invoke(["export-prompts", *where])
    assert prompts.exit_code == 0
    assert [json.loads(line)["id"] for line in prompts.stdout.splitlines()][:1] == ["p00"]
    assert "gate run --candidate-trace" in prompts.stderr and '"prompt_token_ids"' not in prompts.stderr
    shard = toy["tmp"] / "s1.jsonl"
    assert invoke(["run", *where, "--engine", "fake", "--shard", "1/1", "--save-trace", str(shard)]).exit_code == 0
    merged = invoke(["merge", str(shard), "-o", "-"])
    assert merged.exit_code == 0, merged.output
    assert json.loads(merged.stdout.splitlines()[0])["gate_trace"] == 1 and "merged 1 shard" in merged.stderr


def test_a_partial_report_says_so(toy: dict[str, Any]) -> None:
    where = [*toy["where"], "--engine", "fake", "--format", "json"]
    assert "meta" not in json.loads(invoke(["run", *where]).stdout)  # complete: the same however it ran
    shard = json.loads(invoke(["run", *where, "--shard", "1/2"]).stdout)
    assert shard["meta"]["command"] == "gate run" and shard["meta"]["shard"] == "1/2"
    assert shard["meta"]["partial"] is True and shard["meta"]["interrupted"] is None
    assert "meta" not in json.loads(invoke(["compare", *SEED, "--format", "json"]).stdout)
