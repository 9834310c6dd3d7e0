"""Hostile candidates against the default pin, through `gate compare` (pure: no
engine, no torch), judged by its oracle floor (the pin without its float32 reference:
`pin_without_reference`; the reference's own attacks: tests/core/test_reference.py and
the monotonicity properties). Each was ratified (or accepted) before the rule it tests existed; each
must now be exit 1 (a verdict) or 2 (bad input) as its kind requires, while the honest
copies built the same way still pass.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.gate_cli import invoke
from helpers.pin_attacks import (
    PIN,
    candidate,
    flipped,
    gap,
    oracle_dicts,
    own_step,
    pin_without_reference,
    raise_runner_up,
    resort,
    same,
    ten_flips,
    unit,
    write,
)


def _compare(tmp_path: Path, head: dict[str, Any], records: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    path = write(tmp_path / "cand.jsonl", head, records)
    r = invoke(["compare", str(pin_without_reference(tmp_path)), str(path), "--format", "json"])
    assert r.exit_code in (0, 1), r.output
    return r.exit_code, json.loads(r.stdout)


def _close(rec: dict[str, Any], i: int, lo: float, hi: float) -> bool:
    """The oracle's top-2 gap at i is within (lo, hi] evidence units."""
    g = gap(rec, i) / unit(rec, i)
    return lo < g <= hi


# --------------------------------------------------------------------------- honest copies pass


def test_the_pin_itself_as_a_candidate_is_a_strict_pass(tmp_path: Path) -> None:
    code, report = _compare(tmp_path, *candidate(same))
    assert code == 0 and report["verdict"] == "strict_pass", report["summary"]
    assert "not_greedy" not in report and report["drift"]["median_ulps"] == 0.0


@pytest.mark.parametrize("noise", [0.5, 1.0])
def test_honest_sized_noise_everywhere_passes(tmp_path: Path, noise: float) -> None:
    """Every runner-up moved by up to `noise` units, in both directions: the size of the
    drift honest engines show (median 0.5, p90 1, per prompt at most 1)."""

    def own(p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> list[list[Any]]:
        shift = noise * (((p * 7 + i * 3) % 5) - 2) / 2  # -noise .. +noise, no bias
        return raise_runner_up(shift)(p, rec, i, top)

    code, report = _compare(tmp_path, *candidate(own))
    assert code == 0, (report["summary"], report["drift"]["beyond_where"])
    assert report["drift"]["beyond"] is False


def test_a_trace_recorded_before_forced_lists_earns_no_grid_allowance(tmp_path: Path) -> None:
    """Top-k in the free run, forced ids but no forced lists (traces before forced lists):
    the pin's evidence rule asks for the candidate's list at each flip, so a forced flip
    within the grid rule's 2 steps is a defect (rule `no_list`: it used to fall back to the
    grid rule); and the pin carries an honest floor measured with lists at every forced
    position, so the run is not judged by the distribution verdict either (exit 1, naming
    what is missing)."""
    flips = {}
    for p, rec in enumerate(oracle_dicts()):
        # Beyond the 125-mnat threshold by more than a float32 rounding (one bf16 step read as
        # 125.00012 mnats is within it), within the grid rule's 2 steps.
        i = next((i for i in range(len(rec["token_ids"])) if 0.126 < gap(rec, i) <= 2 * own_step(rec, i)), None)
        if i is not None and len(flips) < 5:
            flips[p] = i

    def choose(p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> int | None:
        return int(rec["top_logprobs"][i][1][0]) if flips.get(p) == i else None

    head, recs = candidate(same, choose=choose, forced_lists=False, only_forced_flips=True)
    code, report = _compare(tmp_path, head, recs)
    rules = {d["rule"] for d in report["divergences"]}
    assert report["counts"]["defects"] == len(flips) and rules == {"no_list"}
    assert code == 1 and report["verdict"] == "fail", report["summary"]
    dist = report["distribution"]
    assert dist["rule"] == "distribution_not_judged" and dist["judged"] is False
    assert dist["coverage"]["missing_lists"] == report["counts"]["positions"], dist["coverage"]  # every forced one


# --------------------------------------------------------------------------- 1. not greedy over its own lists


def _penalised(p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> int | None:
    """A sampler with a penalty: where the oracle's gap is 1-4 units it takes the runner-up,
    though the raw list it reports (the oracle's own) ranks the oracle's token first."""
    return int(top[1][0]) if _close(rec, i, 1.0, 4.0) else None


def test_a_candidate_not_greedy_over_its_own_lists_fails_in_the_free_run(tmp_path: Path) -> None:
    code, report = _compare(tmp_path, *candidate(same, choose=_penalised, forced=False))
    assert code == 1, report["summary"]
    assert report["not_greedy_total"] > 0
    first = report["not_greedy"][0]
    assert first["source"] == "free_run" and first["behind_mnats"] > 0 and first["best_token"] != first["chosen"]
    assert report["counts"]["near_ties"] == 0 and report["counts"]["exact_ties"] == 0
    assert {d["rule"] for d in report["divergences"]} == {"not_greedy"}


def test_a_candidate_not_greedy_in_its_forced_decode_fails(tmp_path: Path) -> None:
    code, report = _compare(tmp_path, *candidate(same, choose=_penalised, only_forced_flips=True))
    assert code == 1, report["summary"]
    assert {g["source"] for g in report["not_greedy"]} == {"forced"}
    assert all(d["class"] == "defect" and d["rule"] == "not_greedy" for d in report["divergences"])


def test_the_reports_name_a_candidate_not_greedy_over_its_own_logprobs(tmp_path: Path) -> None:
    path = write(tmp_path / "cand.jsonl", *candidate(same, choose=_penalised, forced=False))
    for fmt in ("rich", "markdown", "html", "junit"):
        r = invoke(["compare", str(PIN), str(path), "--format", fmt])
        assert r.exit_code == 1, r.output
        assert "not greedy over its own logprobs" in " ".join(r.stdout.split()), fmt


def test_a_choice_inside_one_float32_rounding_of_the_top_is_greedy(tmp_path: Path) -> None:
    """Among (nearly) equal maxima the choice is a tie-break, not a contradiction."""

    def own(p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> list[list[Any]]:
        if p == 0 and i == 0:
            (t0, lp0), (t1, _), *rest = top
            return resort([[t0, lp0], [t1, lp0], *rest])  # the runner-up tied at the top
        return [list(x) for x in top]

    def choose(p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> int | None:
        return max(int(top[0][0]), int(top[1][0])) if p == 0 and i == 0 else None  # the higher id of the tie

    code, report = _compare(tmp_path, *candidate(own, choose=choose))
    assert "not_greedy" not in report, report["not_greedy"]
    assert code == 0, report["summary"]


# --------------------------------------------------------------------------- 2. drift where it happens


def _late(p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> list[list[Any]]:
    return raise_runner_up(3.0)(p, rec, i, top) if i >= 16 else [list(x) for x in top]


def _every_third(p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> list[list[Any]]:
    return raise_runner_up(3.0)(p, rec, i, top) if p % 3 == 0 else [list(x) for x in top]


@pytest.mark.parametrize(("own", "where"), [(_late, "positions 16-31"), (_every_third, "prompt ")])
def test_a_bias_confined_to_late_positions_or_some_prompts_is_caught(tmp_path: Path, own: Any, where: str) -> None:
    code, report = _compare(tmp_path, *candidate(own))
    drift = report["drift"]
    assert drift["median_ulps"] <= 2.0  # the run's median alone would not see it
    assert code == 1, report["summary"]
    assert drift["beyond"] and any(where in w for w in drift["beyond_where"]), drift["beyond_where"]
    assert report["counts"]["defects"] > 0 and "drift_beyond" in {d["rule"] for d in report["divergences"]}


def test_a_tail_beyond_the_limit_is_caught(tmp_path: Path) -> None:
    """A 5-unit bias at every fifth position: every median stays 0, the run's p90 is 5."""

    def own(p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> list[list[Any]]:
        return raise_runner_up(5.0)(p, rec, i, top) if (p + i) % 5 == 0 else [list(x) for x in top]

    code, report = _compare(tmp_path, *candidate(own))
    assert code == 1, report["summary"]
    assert any(w.startswith("run p90") for w in report["drift"]["beyond_where"]), report["drift"]


def test_too_few_positions_say_the_drift_is_not_judged(tmp_path: Path) -> None:
    """8 positions (fewer than 16): the report says the drift is not judged, prints no limit."""
    from gate.core.traces.reader import read_trace

    oracle = read_trace(pin_without_reference(tmp_path), "oracle")
    o_rec = oracle.records[0].to_dict()
    for key in ("token_ids", "top_logprobs", "token_logits", "tokens"):
        if key in o_rec:
            o_rec[key] = o_rec[key][:8]
    o_path = write(tmp_path / "o8.jsonl", oracle.header.to_dict(), [o_rec])
    head, recs = candidate(raise_runner_up(-3.0), forced=False)
    c = dict(recs[0], token_ids=recs[0]["token_ids"][:8], top_logprobs=recs[0]["top_logprobs"][:8])
    c_path = write(tmp_path / "c8.jsonl", head, [c])
    r = invoke(["compare", str(o_path), str(c_path), "--details"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "run drift: not judged (8 < 16 positions)" in text, text
    assert "limit" not in text.split("not judged")[1].split("units over")[0]
    r = invoke(["compare", str(o_path), str(c_path), "--format", "json"])
    assert json.loads(r.stdout)["drift"]["judged"] is False


# --------------------------------------------------------------------------- 3. less evidence is never laxer


def test_flips_its_own_lists_call_clear_choices_are_defects(tmp_path: Path) -> None:
    code, report = _compare(tmp_path, *flipped(empty=False))
    assert code == 1 and report["counts"]["defects"] == 10, report["summary"]
    assert {d["rule"] for d in report["divergences"]} == {"own_margin_beyond"}


def test_empty_lists_at_exactly_those_flips_are_no_laxer(tmp_path: Path) -> None:
    code, report = _compare(tmp_path, *flipped(empty=True))
    assert code == 1 and report["counts"]["defects"] == 10, report["summary"]
    assert {d["rule"] for d in report["divergences"]} == {"no_list"}


def test_missing_lists_where_the_rest_of_the_free_run_has_them_are_no_laxer(tmp_path: Path) -> None:
    flips = ten_flips()
    firsts = {p: i for p, i in sorted(flips)[::-1]}  # the first flip of each prompt

    def choose(p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> int | None:
        return int(rec["top_logprobs"][i][1][0]) if firsts.get(p) == i else None

    head, recs = candidate(same, choose=choose, forced=False)
    for p, i in firsts.items():
        recs[p]["top_logprobs"][i] = []
    code, report = _compare(tmp_path, head, recs)
    assert code == 1, report["summary"]
    assert {d["rule"] for d in report["divergences"]} == {"no_list"}


# --------------------------------------------------------------------------- 4. forced lists checked as top_logprobs


def _forced_fault(kind: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    head, recs = candidate(same)
    first = recs[0]["forced_top_logprobs"]
    if kind == "above 0":
        first[3][0][1] = 0.25
    elif kind == "repeated id":
        first[3][1][0] = first[3][0][0]
    elif kind == "unsorted":
        first[3][0], first[3][1] = first[3][1], first[3][0]
    elif kind == "top_k 0":
        head["top_k"] = 0
        for r in recs:
            r.pop("top_logprobs")
    elif kind == "too many pairs":
        head["top_k"] = 1
        for r in recs:
            r.pop("top_logprobs")
        first[3] = resort([[1000 + j, -1.0 - j / 1000] for j in range(502)])
    elif kind == "true as id":
        first[3][-1][0] = True
    elif kind == "no forced ids":
        recs[0].pop("forced_token_ids")
    elif kind == "NaN":
        first[3][-1][1] = float("nan")
    return head, recs


@pytest.mark.parametrize(
    ("kind", "needle"),
    [
        ("above 0", "is above 0"),
        ("repeated id", "appears twice"),
        ("unsorted", "out of order"),
        ("top_k 0", "top_k is 0"),
        ("too many pairs", "header's top_k is 1"),
        ("true as id", "token id must be an integer"),
        ("no forced ids", "needs forced_token_ids"),
    ],
)
def test_forced_top_logprobs_are_checked_as_top_logprobs_are(tmp_path: Path, kind: str, needle: str) -> None:
    path = write(tmp_path / "cand.jsonl", *_forced_fault(kind))
    r = invoke(["compare", str(PIN), str(path)])
    assert r.exit_code == 2, r.output
    assert needle in r.stderr and "cand.jsonl:2" in r.stderr and "forced_top_logprobs" in r.stderr, r.stderr


def test_forced_lists_are_validated_once_per_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Linear time: one check of a record's forced lists, however many forced flips it has
    (every forced divergence used to re-validate the whole list)."""
    import gate.core.traces.reader as reader_mod
    import gate.core.traces.validate as validate_mod

    calls: list[str] = []
    real = validate_mod.check_top_logprobs

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(str(kwargs.get("fld", "top_logprobs")))
        return real(*args, **kwargs)

    monkeypatch.setattr(reader_mod, "check_top_logprobs", counting)
    monkeypatch.setattr(validate_mod, "check_top_logprobs", counting)  # check_forced_top's
    head, recs = candidate(raise_runner_up(2.5))  # flips at many forced positions
    path = write(tmp_path / "cand.jsonl", head, recs)
    r = invoke(["compare", str(PIN), str(path), "--format", "json"])
    assert r.exit_code in (0, 1), r.output
    forced_checks = [c for c in calls if "forced_top_logprobs" in c]
    assert len(forced_checks) == len(recs), len(forced_checks)
    assert sum(d["source"] == "forced" for d in json.loads(r.stdout)["divergences"]) > len(recs)
