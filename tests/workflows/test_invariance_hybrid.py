"""`gate invariance` on a hybrid model with recurrent state (slow: loads a model): the tiny
Qwen3.5-MoE (Gated DeltaNet + gated attention) under every cell the HF engine declares, the
chunked prefill in chunks of the gated delta rule's 64 tokens (each prompt, about 90 tokens,
crosses one). The honest engine runs every cell, invariant or within the noise; an engine
whose recurrent state slot keeps the previous request's state is caught."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gate.core.pins.pin import doctrine_for, load_pin
from gate.core.verdict.invariance import BITWISE_INVARIANT, INVARIANT_WITHIN_NOISE, VARIES, InvarianceResult

pytestmark = pytest.mark.slow

DELTA_CHUNK = 64


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    from helpers.tiny_pin import build_tiny_hybrid_pin, one_thread

    with one_thread():
        yield build_tiny_hybrid_pin(tmp_path_factory.mktemp("invariance-hybrid"))


def matrix(hybrid: tuple[Path, Path], cls: Any, cells: tuple[str, ...] | None = None) -> InvarianceResult:
    from helpers.tiny_pin import HYBRID_MODEL, one_thread

    from gate.workflows.invariance.core import CELLS, InvariancePlan, run_invariance

    weights, pins = hybrid
    pin = load_pin(HYBRID_MODEL, pins)

    def load(options: Mapping[str, str]) -> Any:
        return cls(str(weights), **dict(options))

    plan = InvariancePlan(cells=cells or CELLS, batch=4, chunk=DELTA_CHUNK)
    with one_thread():
        # Routing is not what the cells judge (tests/engines/test_hf_routing_schedules.py checks
        # its record under the batch and the prefix cache); left unrecorded to keep this cheap.
        options = {"record_routing": "false"}
        return run_invariance(load, cls, pin, doctrine_for(pin), plan, engine_name="hf", options=options)


def test_the_honest_hf_engine_runs_every_cell_on_the_hybrid(hybrid: tuple[Path, Path]) -> None:
    from helpers.tiny_pin import HYBRID_MODEL

    from gate.engines.hf.engine import HFEngine

    result = matrix(hybrid, HFEngine)
    by = {c.schedule.cell: c for c in result.cells}
    prompts = load_pin(HYBRID_MODEL, hybrid[1]).trace.records
    assert min(len(r.prompt_token_ids) for r in prompts) > DELTA_CHUNK
    ran = {name for name, cell in by.items() if cell.ran}
    declared = {"batch", "needle", "threads", "chunked_prefill", "prefill", "prefix_cache"}
    assert ran == {"repeat", "shuffle", "forced_decode", *declared}
    for name in ran:
        assert by[name].verdict in (BITWISE_INVARIANT, INVARIANT_WITHIN_NOISE), (name, by[name].to_dict())
    for name in ("repeat", "forced_decode", "shuffle"):
        assert by[name].verdict == BITWISE_INVARIANT, (name, by[name].to_dict())
    assert by["chunked_prefill"].schedule.knobs["chunked_prefill"] == DELTA_CHUNK
    # A recurrent state is kept after whole prompts only, and the shared head's at the first
    # branch: the first prompt's second serving computes its head again (and keeps it), every
    # later prompt starts from a snapshot.
    reuse = by["prefix_cache"].to_dict()["cache_reuse"]
    head = len("The farm wakes before the sun, and then ")  # the prompts' shared text, a byte a token
    assert reuse == {"requests_hit": len(prompts) - 1, "tokens_reused": head * (len(prompts) - 1)}


def test_a_recurrent_state_kept_from_the_previous_request_is_caught(hybrid: tuple[Path, Path]) -> None:
    from gate.engines.hf.stale_state import StaleRecurrentStateHFEngine

    result = matrix(hybrid, StaleRecurrentStateHFEngine, ("repeat", "shuffle"))
    by = {c.schedule.cell: c for c in result.cells}
    assert by["repeat"].verdict == VARIES and by["shuffle"].verdict == VARIES, result.to_dict()
    assert result.exit_code == 1


def test_selftest_plants_the_stale_state_mutant_on_a_recurrent_model_and_it_is_a_defect(
    hybrid: tuple[Path, Path],
) -> None:
    from helpers.tiny_pin import HYBRID_MODEL, one_thread

    from gate.core.calibration.selftest import EXPECT_DEFECT
    from gate.engines.hf.mutants import baseline_loader, mutations
    from gate.workflows.calibration.selftest import run_selftest

    weights, pins = hybrid
    planted = mutations(str(weights), {}, only=["stale-recurrent-state"])
    assert [(m.name, m.expect) for m in planted] == [("stale-recurrent-state", EXPECT_DEFECT)]
    pin = load_pin(HYBRID_MODEL, pins)
    with one_thread():
        result = run_selftest(pin, baseline_loader(str(weights), {}), planted, doctrine_for(pin))
    (outcome,) = result.mutants
    assert outcome.met and outcome.against_reference.counts["defects"] > 0, outcome
