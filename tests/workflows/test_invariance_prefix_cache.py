"""The prefix_cache cell of `gate invariance` with the real HF engine on a tiny pinned Llama
(slow: loads a model): the prompts served again with their prefix cached, against the cold
baseline. The honest engine's cache is reused (counted) and the cell compared position by
position; an engine whose cache keeps a stale tail is found to vary."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gate.core.pins.pin import doctrine_for, load_pin
from gate.core.verdict.invariance import BITWISE_INVARIANT, INVARIANT_WITHIN_NOISE, VARIES, InvarianceResult

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    from helpers.tiny_pin import build_tiny_pin, one_thread

    with one_thread():
        yield build_tiny_pin(tmp_path_factory.mktemp("invariance-prefix"))


def matrix(tiny: tuple[Path, Path], cls: Any, loaded: list[Any]) -> InvarianceResult:
    from helpers.tiny_pin import MODEL, one_thread

    from gate.workflows.invariance.core import InvariancePlan, run_invariance

    weights, pins = tiny
    pin = load_pin(MODEL, pins)

    def load(options: Mapping[str, str]) -> Any:
        engine = cls(str(weights), **dict(options))
        loaded.append(engine)
        return engine

    with one_thread():
        plan = InvariancePlan(cells=("repeat", "prefix_cache"))
        return run_invariance(load, cls, pin, doctrine_for(pin), plan, engine_name="hf")


def test_the_honest_hf_prefix_cache_is_reused_and_compared(tiny: tuple[Path, Path]) -> None:
    from gate.engines.hf.engine import HFEngine

    loaded: list[Any] = []
    result = matrix(tiny, HFEngine, loaded)
    assert result.baseline.knobs["prefix_cache"] == "0"
    cell = {c.schedule.cell: c for c in result.cells}["prefix_cache"]
    assert cell.ran and cell.positions > 0, cell.to_dict()
    assert cell.verdict in (BITWISE_INVARIANT, INVARIANT_WITHIN_NOISE), cell.to_dict()
    assert loaded[0].prefix_store is None  # the baseline ran cold
    store = loaded[-1].prefix_store
    # Every prompt's second serving found all but its last token cached.
    assert store is not None and store.hits >= 16 and store.reused_tokens > 16 * 20
    # The cell notes what its judged serving took from the cache: every prompt, all but its last token.
    from helpers.tiny_pin import MODEL

    tokens = sum(len(r.prompt_token_ids) - 1 for r in load_pin(MODEL, tiny[1]).trace.records)
    assert cell.to_dict()["cache_reuse"] == {"requests_hit": cell.prompts, "tokens_reused": tokens}
    assert cell.reuse_note == (
        f"the engine served {tokens} prompt token(s) from its prefix cache over {cell.prompts} "
        f"of the judged run's {cell.prompts} request(s)"
    )
    assert result.to_dict()["schedule_knobs"]["prefix_cache"] == "prefix_cache"


def test_a_stale_prefix_cache_varies(tiny: tuple[Path, Path]) -> None:
    from helpers.planted_engines import StalePrefixCacheBug

    result = matrix(tiny, StalePrefixCacheBug, [])
    by = {c.schedule.cell: c for c in result.cells}
    assert by["repeat"].verdict == BITWISE_INVARIANT  # cold, the engine is honest
    assert by["prefix_cache"].verdict == VARIES, by["prefix_cache"].to_dict()
    assert result.exit_code == 1
