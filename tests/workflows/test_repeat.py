"""`gate run --repeat N`: a candidate whose greedy output changes between repeats cannot be
gated token-exactly; that is exit 3 (an engine fault), with the positions that changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.gate_cli import register_fake, run_fake

from gate.core.traces.trace import PromptRecord
from gate.workflows.run.core import nondeterminism


@pytest.fixture(autouse=True)
def _fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    register_fake(monkeypatch)
    monkeypatch.setenv("GATE_RUNS_DIR", str(tmp_path / "runs"))


run = run_fake


def test_a_deterministic_engine_passes_every_repeat(pins: Path) -> None:
    from helpers.fake_engine import FakeEngine

    FakeEngine.history.clear()
    r = run(pins, "--repeat", "3")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["verdict"] == "strict_pass"
    calls = [ids for call, ids in FakeEngine.history if call == "generate"]
    assert len(calls) == 3 * 6  # every prompt, three times, one a call


def test_changed_tokens_between_repeats_are_exit_3(pins: Path) -> None:
    r = run(pins, "--repeat", "2", "--engine-opt", "nondeterministic=token")
    assert r.exit_code == 3, r.output
    assert r.stdout == ""  # no verdict for an engine that cannot be gated
    assert "engine 'fake' is not deterministic" in r.stderr
    assert "token" in r.stderr and "in repeat 1" in r.stderr and "in repeat 2" in r.stderr
    assert "cannot be gated token-exactly" in r.stderr


def test_changed_logprobs_alone_are_exit_3(pins: Path) -> None:
    r = run(pins, "--repeat", "2", "--engine-opt", "nondeterministic=logprob")
    assert r.exit_code == 3, r.output
    assert "same token" in r.stderr and "position 11" in r.stderr
    assert "6 position(s) changed" in r.stderr


def test_without_repeat_nondeterminism_goes_unseen(pins: Path) -> None:
    # One run of a nondeterministic engine looks fine: that is why --repeat exists.
    r = run(pins, "--engine-opt", "nondeterministic=token")
    assert r.exit_code == 0, r.output


def test_repeat_must_be_at_least_1(pins: Path) -> None:
    r = run(pins, "--repeat", "0")
    assert r.exit_code == 2, r.output
    assert "--repeat 0" in r.stderr


def _rec(tokens: tuple[int, ...], lps: tuple[float, ...]) -> PromptRecord:
    return PromptRecord(
        id="a",
        prompt_token_ids=(1,),
        token_ids=tokens,
        top_logprobs=[[[t, lp]] for t, lp in zip(tokens, lps, strict=True)],
    )


def test_nondeterminism_names_the_first_changed_token_and_every_changed_logprob() -> None:
    base = _rec((3, 4, 5), (-0.1, -0.2, -0.3))
    assert nondeterminism([[base], [base], [base]]) == []
    lp = _rec((3, 4, 5), (-0.1, -0.25, -0.3))
    [change] = nondeterminism([[base], [lp]])
    assert "position 1: same token 4" in change
    tok = _rec((3, 9, 5), (-0.1, -0.2, -0.3))
    [change] = nondeterminism([[base], [base], [tok]])
    assert change == "prompt 'a' position 1: token 4 in repeat 1, 9 in repeat 3"
    short = _rec((3,), (-0.1,))
    [change] = nondeterminism([[base], [short]])
    assert "position 1: token 4 in repeat 1, None in repeat 2" in change
