"""The distribution verdict: KL over the common top-k, same top, Δp, by
class, the pin's floor, and what the reports say. Hand-built traces; no engine, no torch."""

from __future__ import annotations

import html
import math
from typing import Any

import orjson
import pytest

from gate.core.traces.trace import PromptRecord, Trace, TraceHeader
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.distribution import (
    BEYOND_WHY,
    MIN_POSITIONS,
    Figures,
    Point,
    kl_common_mnats,
    quantile,
    top_token,
)
from gate.core.verdict.doctrine import Doctrine, check_pin_doctrine, resolve_doctrine
from gate.core.verdict.floor import Floor
from gate.errors import InputError
from gate.reports import render

PROMPT = (1, 2, 3)
FLOOR = Floor(kl_mean_mnats=1.0, kl_p99_mnats=10.0, same_top_rate=0.98, margin=2.0, measured_by="test")


def _lp(weights: dict[int, float]) -> list[list[Any]]:
    """A top list with the given (unnormalised) probabilities, over a vocabulary where the
    listed tokens hold half the mass: logprobs below 0, sorted as the spec orders them."""
    z = sum(weights.values()) * 2.0
    pairs = [[t, math.log(w / z)] for t, w in weights.items()]
    pairs.sort(key=lambda p: (-p[1], p[0]))
    return pairs


def _traces(
    oracle_tops: list[list[list[list[Any]]]],
    cand_tops: list[list[list[list[Any]]]],
    *,
    cand_tokens: list[list[int]] | None = None,
    forced: bool = False,
) -> tuple[Trace, Trace]:
    o_recs, c_recs = [], []
    for n, (otops, ctops) in enumerate(zip(oracle_tops, cand_tops, strict=True)):
        ids = tuple(int(t[0][0]) for t in otops)
        o_recs.append(PromptRecord(id=f"p{n}", prompt_token_ids=PROMPT, token_ids=ids, top_logprobs=otops))
        own = tuple(cand_tokens[n]) if cand_tokens is not None else tuple(top_token(t) or 0 for t in ctops)
        if forced:
            c_recs.append(
                PromptRecord(
                    id=f"p{n}",
                    prompt_token_ids=PROMPT,
                    token_ids=own,
                    top_logprobs=ctops,
                    forced_token_ids=tuple(top_token(t) or 0 for t in ctops),
                    extra={"forced_top_logprobs": ctops},
                )
            )
        else:
            c_recs.append(PromptRecord(id=f"p{n}", prompt_token_ids=PROMPT, token_ids=own, top_logprobs=ctops))
    engine = {"name": "e", "version": "1"}
    oracle = Trace(TraceHeader("oracle", "m", 4, engine), tuple(o_recs), "oracle.jsonl")
    cand = Trace(TraceHeader("candidate", "m", 4, engine), tuple(c_recs), "candidate.jsonl")
    return oracle, cand


# --------------------------------------------------------------------------- the maths


def test_kl_of_identical_lists_is_zero_and_of_shifted_lists_too() -> None:
    top = _lp({5: 6.0, 6: 3.0, 7: 1.0})
    assert kl_common_mnats(top, top) == (0.0, 3)
    # The same distribution with another normaliser (more mass outside the list): renormalised
    # over the common support, nothing moved.
    shifted = [[t, lp - 0.7] for t, lp in top]
    kl, support = kl_common_mnats(top, shifted)
    assert support == 3 and kl == pytest.approx(0.0, abs=1e-9)


def test_kl_matches_the_definition_on_the_common_support() -> None:
    o = _lp({1: 0.7, 2: 0.2, 3: 0.1})
    c = _lp({1: 0.5, 2: 0.4, 9: 0.1})  # token 3 missing, 9 extra: support {1, 2}
    p = {1: 0.7 / 0.9, 2: 0.2 / 0.9}
    q = {1: 0.5 / 0.9, 2: 0.4 / 0.9}
    want = 1000.0 * sum(p[t] * math.log(p[t] / q[t]) for t in p)
    kl, support = kl_common_mnats(o, c)
    assert support == 2
    assert kl == pytest.approx(want, rel=1e-9)


def test_kl_with_nothing_in_common_is_counted_zero_with_no_support() -> None:
    assert kl_common_mnats(_lp({1: 1.0, 2: 1.0}), _lp({3: 1.0, 4: 1.0})) == (0.0, 0)


def test_top_token_takes_the_lowest_id_among_equal_maxima() -> None:
    assert top_token([[9, -0.5], [4, -0.5], [2, -1.0]]) == 4  # unsorted input: still argmax's rule
    assert top_token([]) is None


def test_quantiles_nearest_rank_and_median() -> None:
    values = sorted(float(i) for i in range(1, 101))
    assert quantile(values, 0.99) == 99.0
    assert quantile(values, 0.5) == 50.5
    assert quantile([3.0], 0.99) == 3.0
    assert quantile([], 0.5) is None


def test_figures_mean_standard_error_same_top_and_delta_p() -> None:
    pts = [
        Point("a", 0, "match", 1.0, True, 1.0, 4),
        Point("a", 1, "match", 3.0, True, -1.0, 4),
        Point("a", 2, "near_tie", 5.0, False, None, 4),
    ]
    f = Figures.of(pts)
    assert f.positions == 3 and f.kl_mean_mnats == pytest.approx(3.0)
    assert f.kl_se_mnats == pytest.approx(2.0 / math.sqrt(3))  # sample sd 2
    assert f.kl_median_mnats == 3.0 and f.kl_max_mnats == 5.0
    assert f.same_top_rate == pytest.approx(2 / 3)
    assert f.same_top_se == pytest.approx(math.sqrt((2 / 3) * (1 / 3) / 3))
    assert f.dp_positions == 2 and f.dp_mean_pct == 0.0 and f.dp_rms_pct == pytest.approx(1.0)


# --------------------------------------------------------------------------- positions compared


def test_only_positions_on_the_oracles_context_are_measured_without_forced_lists() -> None:
    a, b = _lp({10: 0.6, 11: 0.4}), _lp({20: 0.9, 21: 0.1})
    far = _lp({30: 0.1, 31: 0.9})  # the candidate's list after its divergence: another context
    oracle, cand = _traces([[a, b, b]], [[_lp({11: 0.6, 10: 0.4}), far, far]])
    d = compare(oracle, cand).distribution
    assert d is not None
    # The first divergence (position 0) shares the oracle's context; 1 and 2 do not.
    assert d.overall.positions == 1
    assert d.overall.same_top_rate == 0.0
    assert [name for name, _ in d.by_class] == ["defect"]


def test_forced_lists_measure_every_position_by_class() -> None:
    a = _lp({10: 0.5, 11: 0.5 - 1e-3})
    b = _lp({20: 0.9, 21: 0.1})
    cand_top = [[_lp({11: 0.5, 10: 0.5 - 1e-3}), b, b]]
    oracle, cand = _traces([[a, b, b]], cand_top, cand_tokens=[[11, 20, 20]], forced=True)
    r = compare(oracle, cand, Doctrine(near_tie_mnats=125.0))
    d = r.distribution
    assert d is not None
    assert d.overall.positions == 3
    classes = dict(d.by_class)
    assert classes["near_tie"].positions == 1 and classes["match"].positions == 2
    assert classes["match"].kl_mean_mnats == pytest.approx(0.0, abs=1e-9)
    assert classes["near_tie"].same_top_rate == 0.0


def test_a_candidate_without_top_k_is_not_measured_and_not_judged() -> None:
    a = _lp({10: 0.9, 11: 0.1})
    oracle, _ = _traces([[a] * 4], [[a] * 4])
    bare = Trace(
        TraceHeader("candidate", "m", 0, {"name": "e", "version": "1"}),
        (PromptRecord(id="p0", prompt_token_ids=PROMPT, token_ids=(10,) * 4),),
    )
    d = compare(oracle, bare, Doctrine(floor=FLOOR)).distribution
    assert d is not None and d.overall.positions == 0 and not d.judged and not d.beyond


# --------------------------------------------------------------------------- the verdict


def _suite(cand_weights: dict[int, float], n_prompts: int = 4, length: int = 32) -> tuple[Trace, Trace]:
    """Every position the same; teacher-forced (a candidate whose top moves is measured
    everywhere, not only up to its first divergence)."""
    o = _lp({10: 0.8, 11: 0.15, 12: 0.05})
    c = _lp(cand_weights)
    return _traces([[o] * length] * n_prompts, [[c] * length] * n_prompts, forced=True)


def test_a_strict_run_beyond_the_floor_fails_with_the_reason_in_words() -> None:
    oracle, cand = _suite({10: 0.6, 11: 0.3, 12: 0.1})  # same tokens, a different distribution
    clean = compare(oracle, cand)
    assert clean.verdict == "strict_pass"  # no floor: the tokens alone pass
    r = compare(oracle, cand, Doctrine(floor=FLOOR))
    d = r.distribution
    assert d is not None and d.judged and d.beyond
    assert r.verdict == "fail" and r.exit_code == 1
    assert r.counts["defects"] == 0
    assert d.beyond_figures[0].startswith("mean KL")
    text = " ".join(render(r, "rich").split())
    assert BEYOND_WHY in text and "BEYOND THE HONEST FLOOR" in text
    assert "verdict: fail (exit 1: numerics beyond honest drift, the distribution verdict)" in text
    js = orjson.loads(render(r, "json"))
    assert js["verdict"] == "fail" and js["distribution"]["beyond"] is True
    assert js["distribution"]["why"] == BEYOND_WHY
    assert js["distribution"]["floor"]["measured_by"] == "test"
    md = render(r, "markdown")
    assert BEYOND_WHY in md
    junit = render(r, "junit")
    assert 'name="distribution"' in junit and 'type="distribution"' in junit
    assert BEYOND_WHY in render(r, "html")


def test_a_run_within_the_floor_passes_and_says_so() -> None:
    oracle, cand = _suite({10: 0.799, 11: 0.151, 12: 0.05})
    r = compare(oracle, cand, Doctrine(floor=FLOOR))
    assert r.distribution is not None and r.distribution.judged and not r.distribution.beyond
    assert r.verdict == "strict_pass"
    assert "within the honest floor" in " ".join(render(r, "rich").split())


def test_the_limit_is_the_floor_times_its_margin() -> None:
    oracle, cand = _suite({10: 0.6, 11: 0.3, 12: 0.1})
    mean = compare(oracle, cand).distribution.overall.kl_mean_mnats  # type: ignore[union-attr]
    assert mean is not None
    # Beyond a floor at a third of it with margin 2; within the same floor with margin 4.
    tight = Floor(mean / 3, 1e6, 0.0, 2.0, "t")
    loose = Floor(mean / 3, 1e6, 0.0, 4.0, "t")
    assert compare(oracle, cand, Doctrine(floor=tight)).exit_code == 1
    assert compare(oracle, cand, Doctrine(floor=loose)).exit_code == 0


def test_same_top_misses_beyond_the_floor_fail() -> None:
    # Every position's top moves to the runner-up by a hair: KL tiny, same top 0%.
    oracle, cand = _suite({10: 0.4, 11: 0.41, 12: 0.19})
    r = compare(oracle, cand, Doctrine(near_tie_mnats=1e4, floor=Floor(1e6, 1e6, 0.98, 2.0, "t")))
    d = r.distribution
    assert d is not None and d.beyond
    assert any(x.startswith("same top") for x in d.beyond_figures)


def test_too_few_positions_are_shown_but_not_judged() -> None:
    n = MIN_POSITIONS - 1
    oracle, cand = _suite({10: 0.2, 11: 0.7, 12: 0.1}, n_prompts=1, length=n)
    r = compare(oracle, cand, Doctrine(near_tie_mnats=1e6, floor=FLOOR))
    d = r.distribution
    assert d is not None and d.overall.positions == n and not d.judged and not d.beyond
    assert "not judged" in " ".join(render(r, "rich").split())


def test_a_pin_without_a_floor_says_so_in_every_report() -> None:
    oracle, cand = _suite({10: 0.6, 11: 0.3, 12: 0.1})
    r = compare(oracle, cand)
    # Two trace files: no pin, so the sentence names the oracle trace, not a pin.
    said = "no honest floor was given (the oracle trace's header carries none)"
    for fmt in ("rich", "markdown", "html"):
        text = html.unescape(" ".join(render(r, fmt).split()))
        assert said in text and "the pin" not in text, fmt
    assert said in render(r, "junit")
    js = orjson.loads(render(r, "json"))
    assert js["distribution"]["floor"] is None and js["distribution"]["judged"] is False


# --------------------------------------------------------------------------- the floor in the pin


def test_the_floor_travels_in_the_pins_doctrine() -> None:
    own = {"near_tie_ulps": 2, "floor": FLOOR.to_dict()}
    assert check_pin_doctrine(own, "oracle.json")["floor"] == FLOOR.to_dict()
    d = resolve_doctrine(own, source="pin")
    assert d.floor == FLOOR and d.to_dict()["floor"] == FLOOR.to_dict()
    # Command-line thresholds replace the token rule, not the pin's measured noise.
    assert resolve_doctrine(own, {"near_tie_mnats": 200.0}).floor == FLOOR


@pytest.mark.parametrize(
    "change, words",
    [
        ({"kl_mean_mnats": 0.0}, "must be > 0"),
        ({"kl_p99_mnats": -1.0}, "must be > 0"),
        ({"same_top_rate": 1.0}, "same_top_rate"),
        ({"margin": 0.5}, "margin must be >= 1"),
        ({"measured_by": ""}, "measured_by"),
        ({"kl_mean_mnats": "1"}, "finite number"),
        ({"kl_mean_mnats": float("nan")}, "finite number"),
        ({"extra": 1}, "unknown extra"),
    ],
)
def test_a_bad_floor_is_an_input_error_naming_the_field(change: dict[str, Any], words: str) -> None:
    raw = {**FLOOR.to_dict(), **change}
    with pytest.raises(InputError, match=words):
        check_pin_doctrine({"floor": raw}, "oracle.json")


def test_a_floor_missing_a_key_is_refused() -> None:
    raw = FLOOR.to_dict()
    del raw["measured_by"]
    with pytest.raises(InputError, match="missing measured_by"):
        Floor.from_dict(raw, "oracle.json")


# --------------------------------------------------------------------------- gate pin record measures a floor


def _rerun(name: str, positions: int, mean: float, p99: float, same: float) -> Any:
    from gate.workflows.pins.floor import HonestRerun

    misses = round(positions * (1 - same))
    pts = [Point("p", i, "match", mean, i >= misses, 0.0, 4) for i in range(positions)]
    base = Figures.of(pts)
    from dataclasses import replace

    return HonestRerun(name, replace(base, kl_p99_mnats=p99))


def test_the_floor_is_the_worst_honest_rerun_and_says_how_it_was_measured() -> None:
    from gate.workflows.pins.floor import DEFAULT_MARGIN, floor_from

    fl = floor_from(
        [_rerun("vllm one at a time", 200, 0.5, 4.0, 0.99), _rerun("hf on cpu", 200, 1.5, 3.0, 0.995)], where="cpu:X"
    )
    assert fl is not None
    assert (fl.kl_mean_mnats, fl.kl_p99_mnats, fl.same_top_rate) == (1.5, 4.0, 0.99)
    assert fl.margin == DEFAULT_MARGIN
    assert fl.measured_by.startswith("gate pin record on cpu:X")
    assert "vllm one at a time: 200 positions" in fl.measured_by and "hf on cpu" in fl.measured_by


def test_no_floor_from_too_few_positions_or_bit_identical_reruns() -> None:
    from gate.workflows.pins.floor import floor_from

    assert floor_from([_rerun("short", MIN_POSITIONS - 1, 1.0, 2.0, 0.9)], where="x") is None
    assert floor_from([_rerun("identical", 500, 0.0, 0.0, 1.0)], where="x") is None
    # No miss in 500 positions: the floor's same-top rate is 1 - 1/500, not 1 (a limit of no miss at all).
    fl = floor_from([_rerun("no miss", 500, 1.0, 2.0, 1.0)], where="x")
    assert fl is not None and fl.same_top_rate == pytest.approx(1 - 1 / 500)


def test_pin_record_measures_a_floor_from_a_rerun_that_differs(tmp_path: Any, monkeypatch: Any) -> None:
    import json

    from helpers.gate_cli import TOY_MODEL, invoke, register_fake, toy_pin_folder

    from gate.core.pins.pin import doctrine_for, load_pin

    register_fake(monkeypatch)
    # From its second generation of a prompt on, the toy engine moves one logprob: its
    # one-prompt-at-a-time re-run is not the batch bit for bit, as a real engine's is not.
    folder = toy_pin_folder(tmp_path, n=8, max_tokens=16, engine_options={"nondeterministic": "logprob"})
    r = invoke(["pin", "record", "--model", TOY_MODEL, "--pins-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "honest floor: mean KL" in r.stderr
    saved = json.loads((folder / "oracle.json").read_text())["doctrine"]["floor"]
    assert "fake one prompt at a time vs batched: 128 positions" in saved["measured_by"]
    pin = load_pin(TOY_MODEL, tmp_path)
    assert pin.trace.header.extra["doctrine"]["floor"] == saved
    assert doctrine_for(pin).floor == Floor.from_dict(saved)
    # Re-recording keeps the floor oracle.json carries.
    r = invoke(["pin", "record", "--model", TOY_MODEL, "--pins-dir", str(tmp_path), "--force"])
    assert r.exit_code == 0, r.output
    assert "kept the one oracle.json's doctrine carries" in r.stderr


def test_pin_record_without_a_measurable_floor_says_so(tmp_path: Any, monkeypatch: Any) -> None:
    from helpers.gate_cli import TOY_MODEL, invoke, register_fake, toy_pin_folder

    register_fake(monkeypatch)
    toy_pin_folder(tmp_path)
    r = invoke(["pin", "record", "--model", TOY_MODEL, "--pins-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "honest floor: none measured" in r.stderr
    r = invoke(["pin", "record", "--model", TOY_MODEL, "--pins-dir", str(tmp_path), "--force", "--no-floor"])
    assert r.exit_code == 0, r.output
    assert "honest floor: not measured (--no-floor)" in r.stderr
