"""The prefix_cache cell's note on what the engine's cache served (the toy engine of
tests/helpers/fake_schedules.py, with a block-wise prefix cache): served, served nothing,
or not reported; the verdict never reads it."""

from __future__ import annotations

import html
import json
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.gate_cli import TOY_MODEL, invoke, register_fake

from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.invariance import CacheReuse, CellResult, InvarianceResult, Schedule

FAKES = "helpers.fake_schedules"
HIT = "the engine served"
NOTHING = "the engine served nothing from its prefix cache: this cell did not exercise it"
SILENT = "the engine does not report its cache reuse"


@pytest.fixture(autouse=True)
def _fake(monkeypatch: pytest.MonkeyPatch) -> None:
    register_fake(monkeypatch)


def invariance(pins: Path, engine: str, fmt: str, *args: str) -> str:
    argv = ["invariance", "--model", TOY_MODEL, "--pins-dir", str(pins), "--engine", f"{FAKES}:{engine}"]
    r = invoke([*argv, "--schedules", "prefix_cache", "--format", fmt, *args])
    assert r.exit_code == 0, r.output
    return r.stdout


def cell(pins: Path, engine: str, *args: str) -> dict:
    out = json.loads(invariance(pins, engine, "json", *args))
    return out["cells"][0]


def test_a_cache_that_served_tokens_says_how_many(pins: Path) -> None:
    got = cell(pins, "CacheFake", "--engine-opt", "block=2")
    assert got["cache_reuse"]["requests_hit"] == 6 and got["cache_reuse"]["tokens_reused"] > 0, got
    assert got["verdict"] == "bitwise_invariant" and got["reference"] == "baseline"
    tokens = got["cache_reuse"]["tokens_reused"]
    sentence = f"{HIT} {tokens} prompt token(s) from its prefix cache over 6 of the judged run's 6 request(s)"
    for fmt in ("rich", "markdown", "html"):
        text = invariance(pins, "CacheFake", fmt, "--engine-opt", "block=2")
        assert sentence in " ".join(html.unescape(text).split()), fmt


def test_a_cache_that_served_nothing_says_the_cell_did_not_exercise_it(pins: Path) -> None:
    got = cell(pins, "CacheFake", "--engine-opt", "block=1000")  # longer than every toy prompt
    assert got["cache_reuse"] == {"requests_hit": 0, "tokens_reused": 0}, got
    assert got["verdict"] == "bitwise_invariant"
    for fmt in ("rich", "markdown"):
        text = " ".join(invariance(pins, "CacheFake", fmt, "--engine-opt", "block=1000").split())
        assert NOTHING in text and HIT + " " not in text.replace(NOTHING, "")


def test_the_cells_own_blocks_are_compared_with_a_cold_run_in_the_same_blocks(pins: Path) -> None:
    from helpers.fake_engine import FakeEngine

    FakeEngine.history.clear()
    got = cell(pins, "CacheFake")  # the plan's 32-token blocks, the baseline's left as they are
    assert got["schedule"]["cache_block"] == 32 and got["reference"] == "cold, 32-token blocks", got
    assert got["cache_reuse"]["requests_hit"] == 6 and got["cache_reuse"]["tokens_reused"] % 32 == 0
    loads = [args[1] for call, args in FakeEngine.history if call == "load"]
    assert loads == [{"prefix_cache": "0"}, {"prefix_cache": "0", "block": "32"}, {"prefix_cache": "1", "block": "32"}]


@pytest.mark.parametrize("fake", ["SilentCacheFake", "UncountedCacheFake"])
def test_an_engine_that_does_not_count_says_so_and_judges_the_same(pins: Path, fake: str) -> None:
    silent = cell(pins, fake, "--engine-opt", "block=2")
    counted = cell(pins, "CacheFake", "--engine-opt", "block=2")
    assert silent["cache_reuse"] is None
    assert {k: v for k, v in silent.items() if k != "cache_reuse"} == {
        k: v for k, v in counted.items() if k != "cache_reuse"
    }
    for fmt in ("rich", "markdown"):
        text = " ".join(invariance(pins, fake, fmt).split())
        assert SILENT in text and HIT not in text


@pytest.mark.parametrize("reuse", [CacheReuse(3, 96), CacheReuse(0, 0), None])
@pytest.mark.parametrize("defects", [0, 1])
def test_what_the_engine_reports_of_its_cache_never_moves_a_verdict(reuse: CacheReuse | None, defects: int) -> None:
    flips = {"exact_tie": 0, "near_tie": 0, "defect": defects}
    base = CellResult(Schedule("prefix_cache"), prompts=3, positions=9, bitwise_identical=False, token_flips=flips)
    told = replace(base, cache_reuse=reuse)
    assert told.verdict == base.verdict == ("varies" if defects else "invariant_within_noise")
    matrix = InvarianceResult(engine="e", model="m", baseline=Schedule("baseline"), cells=(told,), doctrine=Doctrine())
    assert matrix.exit_code == replace(matrix, cells=(base,)).exit_code
    assert (told.reuse_note or "").startswith(HIT if reuse and reuse.tokens_reused else "the engine")
    assert "cache_reuse" not in replace(told, schedule=Schedule("repeat")).to_dict()
