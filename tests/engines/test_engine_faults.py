"""Engine faults: each is exit 3 (the engine is broken) or a classified divergence (the
engine is wrong), never a pass. The fake engine shows them on demand (`fault=...`); a real
engine cannot be made to.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.gate_cli import record_toy_pin, register_fake, run_fake

from gate.workflows.common.guard import EngineTimeout, call_with_timeout


@pytest.fixture(autouse=True)
def _fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    from helpers.fake_engine import FakeEngine

    register_fake(monkeypatch)
    monkeypatch.setenv("GATE_RUNS_DIR", str(tmp_path / "runs"))
    FakeEngine.release.clear()
    yield
    FakeEngine.release.set()  # end any hang the test left in a thread


run = run_fake


# (engine options, exit code, what stderr must say)
EXIT_3 = {
    "nan": (["fault=nan", "fault_prompt=p03"], "prompt 'p03': position 0: logprob nan"),
    "inf": (["fault=inf"], "logprob -inf"),
    "short": (["fault=short", "fault_prompt=p01"], "prompt 'p01': returned 9 of 12 tokens with finish_reason 'length'"),
    "oov": (["fault=oov"], "token_ids[0] = 45 is outside the vocabulary of size 40"),
    # force runs only where the free run diverged: the mutation makes it.
    "oov_force": (["fault=oov_force", "tie_break=highest"], "force: token_ids[11] = 45 is outside the vocabulary"),
    "crash": (["fail=generate"], "RuntimeError: toy model crashed in generate"),
}


@pytest.mark.parametrize("fault", sorted(EXIT_3))
def test_a_broken_engine_is_exit_3(pins: Path, fault: str) -> None:
    opts, message = EXIT_3[fault]
    r = run(pins, *(a for o in opts for a in ("--engine-opt", o)))
    assert r.exit_code == 3, r.output
    assert message in r.stderr
    assert r.stdout == ""  # no report, so no verdict to misread
    assert "Traceback" not in r.output


@pytest.mark.parametrize("where", ["hang", "hang_force"])
def test_a_hang_past_timeout_is_exit_3(pins: Path, where: str) -> None:
    from helpers.fake_engine import FakeEngine

    opts = ["--engine-opt", f"fault={where}", "--timeout", "0.5"]
    if where == "hang_force":
        opts += ["--engine-opt", "tie_break=highest"]
    start = time.monotonic()
    r = run(pins, *opts)
    assert r.exit_code == 3, r.output
    assert time.monotonic() - start < 20
    assert "did not finish within --timeout 0.5s" in r.stderr
    assert ("hang", None) in FakeEngine.history
    # The engine is still busy in the abandoned call: it is not closed under it.
    hung_at = FakeEngine.history.index(("hang", None))
    assert ("close", None) not in FakeEngine.history[hung_at:]


def test_timeout_does_not_disturb_a_healthy_engine(pins: Path) -> None:
    r = run(pins, "--timeout", "30")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["verdict"] == "strict_pass"


@pytest.mark.parametrize("bad", ["0", "-1", "nan"])
def test_timeout_must_be_positive(pins: Path, bad: str) -> None:
    r = run(pins, "--timeout", bad)
    assert r.exit_code == 2, r.output
    assert "--timeout" in r.stderr


def test_an_honest_early_stop_is_a_defect_not_a_crash(pins: Path) -> None:
    r = run(pins, "--engine-opt", "fault=short_stop", "--engine-opt", "fault_prompt=p02")
    assert r.exit_code == 1, r.output
    rep = json.loads(r.stdout)
    assert rep["verdict"] == "fail"
    [div] = [d for d in rep["divergences"] if d["prompt_id"] == "p02" and d["source"] == "free_run"]
    assert div["position"] == 9 and div["candidate_token"] is None and div["class"] == "defect"


def test_the_pins_vocab_size_catches_an_engine_that_states_none(pins: Path) -> None:
    r = run(pins, "--engine-opt", "fault=oov", "--engine-opt", "report_vocab=false")
    assert r.exit_code == 3, r.output
    assert "is outside the vocabulary of size 40" in r.stderr


def test_an_out_of_vocabulary_id_is_a_defect_when_no_side_knows_the_vocabulary(tmp_path: Path) -> None:
    root = tmp_path / "pins-novocab"
    record_toy_pin(root, engine_options={"report_vocab": "false"})
    r = run(root, "--engine-opt", "fault=oov", "--engine-opt", "report_vocab=false")
    assert r.exit_code == 1, r.output
    rep = json.loads(r.stdout)
    assert rep["counts"]["defects"] >= 6
    assert {d["candidate_token"] for d in rep["divergences"] if d["position"] == 0} == {45}


# --------------------------------------------------------------------------- the watchdog


def test_call_with_timeout_passes_results_and_errors_through() -> None:
    assert call_with_timeout(lambda: 7, 5.0, "x") == 7
    assert call_with_timeout(lambda: 7, None, "x") == 7

    def boom() -> int:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        call_with_timeout(boom, 5.0, "x")
    gate = threading.Event()
    with pytest.raises(EngineTimeout, match=r"slow call did not finish within --timeout 0\.1s"):
        call_with_timeout(lambda: gate.wait(10), 0.1, "slow call")
    gate.set()
