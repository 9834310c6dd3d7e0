"""`gate run --shard K/N` → `gate merge` → `gate run --candidate-trace`: the whole path
gives the unsharded run's report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.gate_cli import TOY_MODEL, invoke, record_toy_pin, register_fake

from gate.core.traces.reader import read_trace
from gate.core.traces.shards import select_shard

N_PROMPTS = 12
MUTATION = ("--engine-opt", "tie_break=highest")


@pytest.fixture(autouse=True)
def _fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    register_fake(monkeypatch)
    monkeypatch.setenv("GATE_RUNS_DIR", str(tmp_path / "runs"))


@pytest.fixture
def pins(tmp_path: Path) -> Path:
    root = tmp_path / "pins"
    record_toy_pin(root, n=N_PROMPTS)
    return root


def run(pins: Path, *args: str) -> Any:
    return invoke(["run", "--model", TOY_MODEL, "--pins-dir", str(pins), "--format", "json", *args])


def adjudicated(report: dict[str, Any]) -> dict[str, Any]:
    """The report less the tokens' decoded text, which only a loaded engine can give (a
    trace adjudicated on its own has none)."""
    out = dict(report)
    out["divergences"] = [
        {k: v for k, v in d.items() if k not in ("oracle_text", "candidate_text")} for d in report["divergences"]
    ]
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_shards_merged_and_adjudicated_equal_the_unsharded_run(pins: Path, tmp_path: Path, n: int) -> None:
    from helpers.fake_engine import FakeEngine

    whole = run(pins, "--engine", "fake", *MUTATION)
    assert whole.exit_code == 0, whole.output
    expected = json.loads(whole.stdout)
    assert expected["divergences"]

    ids = [f"p{i:02d}" for i in range(N_PROMPTS)]
    paths = []
    for k in range(1, n + 1):
        FakeEngine.history.clear()
        path = tmp_path / f"shard-{k}.jsonl"
        r = run(pins, "--engine", "fake", *MUTATION, "--shard", f"{k}/{n}", "--save-trace", str(path))
        assert r.exit_code in (0, 1), r.output
        mine = select_shard(ids, k, n)
        # The shard ran, and was adjudicated on, its own prompts only.
        ran = [pid for call, got in FakeEngine.history if call == "generate" for pid in got]
        assert ran == mine
        rep = json.loads(r.stdout)
        assert [p["id"] for p in rep["prompts"]] == mine
        assert rep["counts"]["prompts"] == len(mine)
        trace = read_trace(path, role="candidate")
        assert trace.header.extra["shard"] == f"{k}/{n}"
        assert [rec.id for rec in trace.records] == mine
        paths.append(str(path))
    assert sum(len(select_shard(ids, k, n)) for k in range(1, n + 1)) == N_PROMPTS

    merged = tmp_path / "merged.jsonl"
    m = invoke(["merge", *reversed(paths), "--output", str(merged), "--pin-model", TOY_MODEL, "--pins-dir", str(pins)])
    assert m.exit_code == 0, m.output
    final = run(pins, "--candidate-trace", str(merged))
    assert final.exit_code == 0, final.output
    assert adjudicated(json.loads(final.stdout)) == adjudicated(expected)


def test_a_missing_shard_is_refused_by_merge(pins: Path, tmp_path: Path) -> None:
    path = tmp_path / "shard-1.jsonl"
    assert run(pins, "--engine", "fake", "--shard", "1/2", "--save-trace", str(path)).exit_code == 0
    m = invoke(["merge", str(path), "--output", str(tmp_path / "m.jsonl")])
    assert m.exit_code == 2, m.output
    assert "shard(s) 2/2 missing" in m.stderr
    # Nor does a lone shard pass as the whole suite.
    r = run(pins, "--candidate-trace", str(path))
    assert r.exit_code == 2, r.output


@pytest.mark.parametrize("bad", ["3/2", "0/2", "x", "1/0"])
def test_a_bad_shard_is_exit_2_before_the_engine_loads(pins: Path, bad: str) -> None:
    from helpers.fake_engine import FakeEngine

    FakeEngine.history.clear()
    r = run(pins, "--engine", "fake", "--shard", bad)
    assert r.exit_code == 2, r.output
    assert "--shard" in r.stderr
    assert FakeEngine.history == []


def test_shard_does_not_go_with_a_candidate_trace(pins: Path, tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    assert run(pins, "--engine", "fake", "--save-trace", str(path)).exit_code == 0
    r = run(pins, "--candidate-trace", str(path), "--shard", "1/2")
    assert r.exit_code == 2, r.output
    assert "--shard cannot go with it" in r.stderr
