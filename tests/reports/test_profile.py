"""The divergence profile (how often, where, by how much) on the mixed traces, whose every
divergence is known by construction (tests/helpers/trace_builders.py)."""

from __future__ import annotations

from pathlib import Path

import orjson
from helpers.trace_builders import mixed_result

from gate.core.verdict.doctrine import Doctrine
from gate.reports.json_report import render_json
from gate.reports.markdown import render_markdown
from gate.reports.profile import divergence_profile, profile_lines
from gate.reports.terminal import render_text


def test_the_profile_counts_each_band_rank_and_first_divergence(tmp_path: Path) -> None:
    p = divergence_profile(mixed_result(tmp_path))
    assert (p.positions, p.divergent_positions, p.prompts, p.prompts_token_exact) == (64, 8, 8, 2)
    assert p.bands == {
        "exact_tie": 2,  # "tie" (free run) and "forced" position 1
        "near_tie": 2,  # 125 mnats (at the threshold) and 62.5
        "up_to_1_nat": 1,  # 1000 mnats exactly
        "over_1_nat": 1,  # 2000 mnats
        "outside_top_k": 1,
        "stopped": 1,
    }
    assert p.ranks == {"2": 6, "3": 0, "4+": 0, "outside": 1}
    assert p.first_divergence is not None
    assert (p.first_divergence.n, p.first_divergence.median, p.first_divergence.max) == (6, 3.5, 6.0)
    assert p.cost_mnats is not None and p.cost_mnats.max == 2000.0 and p.cost_mnats.n == 6


def test_a_tighter_doctrine_moves_near_ties_to_the_next_band(tmp_path: Path) -> None:
    p = divergence_profile(mixed_result(tmp_path, Doctrine(near_tie_mnats=100.0)))
    assert p.bands["near_tie"] == 1 and p.bands["up_to_1_nat"] == 2


def test_every_report_carries_the_profile(tmp_path: Path) -> None:
    result = mixed_result(tmp_path)
    lines = profile_lines(result)
    assert lines[0].startswith("Divergence profile: 8 of 64 positions diverge (12.5%, 1 in 8)")
    assert "Divergence profile" not in render_text(result)  # a detail of the terminal report
    text = render_text(result, details=True)
    assert "Divergence profile: 8 of 64 positions" in text and "#2 at 6 positions" in text
    assert "Divergence profile: 8 of 64 positions" in render_markdown(result)
    data = orjson.loads(render_json(result))
    assert data["divergence_profile"]["bands"]["over_1_nat"] == 1
    assert data["divergence_profile"]["divergence_rate"] == 0.125


def test_no_divergence_no_profile_lines(tmp_path: Path) -> None:
    from dataclasses import replace

    result = mixed_result(tmp_path)
    clean = replace(result, divergences=())
    assert profile_lines(clean) == []
    assert divergence_profile(clean).divergent_positions == 0


def test_the_near_tie_band_names_the_doctrine_that_made_it(tmp_path: Path) -> None:
    """A profile under the evidence rule must not describe its near ties by the mnats alone:
    the person reading it would take a 4-unit flip for a bug in the report."""
    from dataclasses import replace

    from gate.core.verdict.doctrine import Evidence

    result = mixed_result(tmp_path)
    plain = next(line for line in profile_lines(result) if line.startswith("A near tie is"))
    assert "evidence rule" not in plain
    ruled = replace(result, doctrine=replace(result.doctrine, evidence=Evidence(4, 2, 2)))
    line = next(line for line in profile_lines(ruled) if line.startswith("A near tie is"))
    assert (
        "or one the evidence rule ratifies: an oracle gap of at most 4 steps of the bfloat16 grid, with the "
        "candidate's own margin at most 2 and its drift at most 2." in line
    )
