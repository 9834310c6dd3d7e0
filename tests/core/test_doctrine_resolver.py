"""The one doctrine resolver (`resolve_doctrine`): the pin's doctrine with per-field
overrides, used by every command; and properties of the default pin's doctrine as resolved.

Hypothesis properties: an override changes its own field and no other; the evidence rule
is dropped only by `--no-evidence`; a larger threshold on the default doctrine never turns
a near tie into a defect. No engine, no torch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gate.core.verdict.chain import classify, position_evidence
from gate.core.verdict.doctrine import (
    DEFAULT_NEAR_TIE_MNATS,
    DOCTRINE_FIELDS,
    Doctrine,
    Evidence,
    apply_overrides,
    resolve_doctrine,
)
from gate.core.verdict.grid import grid_step
from gate.core.verdict.result import DEFECT, EXACT_TIE, NEAR_TIE
from gate.errors import InputError

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PIN = ROOT / "oracle_pins" / "HuggingFaceTB" / "SmolLM2-135M-Instruct"


def default_pin_doctrine() -> dict[str, Any]:
    """The doctrine the embedded default's pin ships (its trace header carries the same)."""
    with open(DEFAULT_PIN / "pin.jsonl", "rb") as fh:
        header = json.loads(fh.readline())
    own = header["doctrine"]
    assert own == json.loads((DEFAULT_PIN / "oracle.json").read_text())["doctrine"]
    return dict(own)


# --------------------------------------------------------------------------- examples


def test_a_threshold_flag_keeps_the_pins_evidence_rule() -> None:
    # RED before the resolver: any --near-tie-mnats, even the default 125, dropped the evidence rule.
    own = default_pin_doctrine()
    for flag in ({"near_tie_mnats": DEFAULT_NEAR_TIE_MNATS}, {"near_tie_mnats": 50.0}, {"near_tie_ulps": 1.0}):
        d = resolve_doctrine(own, flag, source="the pin's (p)")
        assert d.evidence == Evidence.from_dict(own["evidence"]), flag
        key, value = next(iter(flag.items()))
        assert d.source == f"the pin's (p); changed on the command line: --{key.replace('_', '-')} {value:g}"


def test_only_no_evidence_drops_the_evidence_rule_and_nothing_else() -> None:
    own = default_pin_doctrine()
    d = resolve_doctrine(own, {"evidence": None}, source="the pin's (p)")
    assert d.evidence is None
    assert d.near_tie_ulps == float(own["near_tie_ulps"]) and d.near_tie_mnats == DEFAULT_NEAR_TIE_MNATS
    assert d.source == "the pin's (p); changed on the command line: --no-evidence"


def test_one_field_of_the_evidence_rule_is_changed_alone() -> None:
    own = default_pin_doctrine()
    d = resolve_doctrine(own, {"evidence.drift_ulps": 3.0})
    assert d.evidence is not None and d.evidence.drift_ulps == 3.0
    assert d.evidence.oracle_ulps == own["evidence"]["oracle_ulps"]
    with pytest.raises(InputError, match="--evidence-drift-ulps 3: the doctrine has no 'evidence' rule to change"):
        resolve_doctrine({"near_tie_ulps": 2}, {"evidence.drift_ulps": 3.0})


def test_without_a_pin_doctrine_the_defaults_apply_and_no_source_is_claimed() -> None:
    assert resolve_doctrine(None) == Doctrine()
    assert resolve_doctrine(None).source == ""
    d = resolve_doctrine(None, {"near_tie_mnats": 60.0})
    assert d == Doctrine(near_tie_mnats=60.0) and d.source == "command line: --near-tie-mnats 60"
    # A command's own defaults stand in for a pin that carries none, never beside one.
    assert resolve_doctrine(None, defaults={"near_tie_ulps": 1}).near_tie_ulps == 1.0
    assert resolve_doctrine({"near_tie_mnats": 10}, defaults={"near_tie_ulps": 1}).near_tie_ulps is None


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"near_tie_mnats": -1.0}, "--near-tie-mnats: must be a number >= 0, found -1.0"),
        ({"near_tie_ulps": math.nan}, "--near-tie-ulps: must be a number >= 0, found nan"),
        ({"grid": 2.0}, "--grid 2: not a doctrine field"),
    ],
)
def test_a_bad_override_names_its_flag(overrides: dict[str, Any], needle: str) -> None:
    with pytest.raises(InputError) as exc:
        resolve_doctrine(default_pin_doctrine(), overrides)
    assert needle in str(exc.value)


def test_a_bad_pin_doctrine_names_where_it_is() -> None:
    with pytest.raises(InputError, match=r"the pin's \(x\): field 'doctrine.near_tie_ulps': must be a number"):
        resolve_doctrine({"near_tie_ulps": "2"}, source="the pin's (x)")


# --------------------------------------------------------------------------- properties

threshold = st.floats(min_value=0.0, max_value=1000.0, allow_nan=False)
evidence = st.fixed_dictionaries(
    {"oracle_ulps": threshold, "candidate_ulps": threshold, "drift_ulps": threshold},
    optional={"floor_logit": st.floats(min_value=0.0, max_value=64.0)},
)
floors = st.fixed_dictionaries(
    {
        "kl_mean_mnats": st.floats(min_value=0.01, max_value=100.0),
        "kl_p99_mnats": st.floats(min_value=0.01, max_value=1000.0),
        "same_top_rate": st.floats(min_value=0.5, max_value=0.999),
        "margin": st.floats(min_value=1.01, max_value=10.0),
        "measured_by": st.just("a study"),
    }
)
pin_doctrines = st.fixed_dictionaries(
    {},
    optional={
        "near_tie_mnats": threshold,
        "near_tie_ulps": threshold,
        "evidence": evidence,
        "dtype": st.sampled_from(["bfloat16", "float16", "float32"]),
        "floor": floors,
        "reference_floor": floors,
    },
)
overrides = st.fixed_dictionaries(
    {},
    optional={"near_tie_mnats": threshold, "near_tie_ulps": threshold, "evidence": st.none()},
)

FIELDS = ("near_tie_mnats", "near_tie_ulps", "evidence", "dtype", "floor", "reference_floor")


@FAST
@given(pin_doctrines, overrides)
def test_an_override_changes_its_own_field_and_no_other(own: dict[str, Any], changes: dict[str, Any]) -> None:
    assert set(FIELDS) == set(DOCTRINE_FIELDS)  # a new field needs a strategy here
    plain = resolve_doctrine(own)
    changed = resolve_doctrine(own, changes)
    for name in FIELDS:
        if name not in changes:
            assert getattr(changed, name) == getattr(plain, name), name
        elif changes[name] is None:
            assert getattr(changed, name) is None
        else:
            assert getattr(changed, name) == changes[name]
    assert changed.strict is False and plain.strict is False


@FAST
@given(pin_doctrines, overrides)
def test_the_evidence_rule_survives_every_override_but_no_evidence(
    own: dict[str, Any], changes: dict[str, Any]
) -> None:
    d = resolve_doctrine(own, changes)
    has = "evidence" in own and "evidence" not in changes
    assert (d.evidence is not None) == has


@FAST
@given(pin_doctrines, overrides)
def test_resolving_is_applying_the_overrides_then_reading_the_pin(own: dict[str, Any], changes: dict[str, Any]) -> None:
    # The same doctrine whether a field comes from the pin or from the command line.
    assert resolve_doctrine(own, changes) == resolve_doctrine(apply_overrides(own, changes))


@FAST
@given(pin_doctrines)
def test_overriding_a_field_with_its_own_value_changes_nothing(own: dict[str, Any]) -> None:
    plain = resolve_doctrine(own)
    same = {k: v for k, v in own.items() if k in ("near_tie_mnats", "near_tie_ulps")}
    assert resolve_doctrine(own, same) == plain


# The default doctrine as resolved: the classifier over a flip at one position.
top_logit = st.floats(min_value=-40.0, max_value=40.0, allow_nan=False)


@st.composite
def flips(draw: st.DrawFn) -> tuple[list[list[Any]], list[list[Any]], float]:
    """An oracle top-3 and a candidate top-3 at one position where the candidate took the
    oracle's runner-up; gaps of a few bf16 grid steps at the drawn top logit."""
    logit = draw(top_logit)
    step = grid_step(logit, "bfloat16")
    gap = draw(st.integers(min_value=0, max_value=12)) * step / 2
    margin = draw(st.integers(min_value=0, max_value=8)) * step / 2
    o_top = [[7, -0.25], [9, -0.25 - gap], [3, -8.0]]
    c_top = [[9, -0.25], [7, -0.25 - margin], [3, -8.0]]
    return o_top, c_top, logit


def _judge(doctrine: Doctrine, case: tuple[list[list[Any]], list[list[Any]], float]) -> str:
    o_top, c_top, logit = case
    evidence = position_evidence(
        prompt_id="p",
        position=0,
        source="forced",
        top=o_top,
        oracle_token=7,
        candidate_token=9,
        doctrine=doctrine,
        top_logit=logit,
        candidate_top=c_top,
    )
    return classify(evidence, doctrine).cls


@FAST
@given(flips(), threshold, threshold)
def test_a_larger_threshold_on_the_default_doctrine_never_makes_a_defect(
    case: tuple[list[list[Any]], list[list[Any]], float], a: float, b: float
) -> None:
    own = default_pin_doctrine()
    lo, hi = sorted((a, b))
    small = _judge(resolve_doctrine(own, {"near_tie_mnats": lo}), case)
    large = _judge(resolve_doctrine(own, {"near_tie_mnats": hi}), case)
    rank = {EXACT_TIE: 0, NEAR_TIE: 1, DEFECT: 2}
    assert rank[large] <= rank[small]


@FAST
@given(flips())
def test_the_default_doctrine_is_at_least_as_strict_without_its_rules(
    case: tuple[list[list[Any]], list[list[Any]], float],
) -> None:
    # Dropping the grid allowance never ratifies more; the mnats threshold alone is the floor.
    own = default_pin_doctrine()
    mnats_only = _judge(resolve_doctrine(own, {"evidence": None, "near_tie_ulps": 0.0}), case)
    full = _judge(resolve_doctrine(own), case)
    if full == DEFECT:
        assert mnats_only == DEFECT
    o_top = case[0]
    gap_mnats = 1000.0 * (o_top[0][1] - o_top[1][1])
    if 0.0 < gap_mnats <= DEFAULT_NEAR_TIE_MNATS:
        assert full == NEAR_TIE == mnats_only


def test_a_bad_value_for_one_field_of_the_evidence_rule_names_its_flag() -> None:
    with pytest.raises(InputError, match="--evidence-drift-ulps: doctrine evidence: drift_ulps must be a finite"):
        resolve_doctrine(default_pin_doctrine(), {"evidence.drift_ulps": -1.0}, source="the pin's (p)")
