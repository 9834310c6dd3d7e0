"""`gate invariance` with the real HF engine on a tiny random Llama (slow: loads a model).

The honest engine's repeat cell is bit-identical, and so is its forced decode along its own
tokens (it runs the very step function of its free run); its batched decoding (left padding)
runs and is compared position by position. A batch of one is the one-prompt loop, bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from gate.core.pins.pin import doctrine_for, load_pin
from gate.core.verdict.invariance import BITWISE_INVARIANT, VARIES, InvarianceResult

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    pytest.importorskip("transformers")
    from helpers.tiny_pin import build_tiny_pin, one_thread

    with one_thread():
        yield build_tiny_pin(tmp_path_factory.mktemp("invariance-hf"))


@pytest.fixture(scope="module")
def matrix(tiny: tuple[Path, Path]) -> InvarianceResult:
    from helpers.tiny_pin import MODEL, one_thread

    from gate.engines.hf.engine import HFEngine
    from gate.workflows.invariance.core import InvariancePlan, run_invariance

    weights, pins = tiny
    pin = load_pin(MODEL, pins)

    def load(options: Mapping[str, str]) -> HFEngine:
        return HFEngine(str(weights), **dict(options))

    cells = ("repeat", "batch", "needle", "chunked_prefill", "forced_decode", "prefill")
    with one_thread():
        return run_invariance(
            load, HFEngine, pin, doctrine_for(pin), InvariancePlan(cells=cells, batch=4, chunk=4), engine_name="hf"
        )


def test_the_honest_hf_engines_repeat_and_forced_decode_are_bit_identical(matrix: InvarianceResult) -> None:
    by = {c.schedule.cell: c for c in matrix.cells}
    for name in ("repeat", "forced_decode"):
        cell = by[name]
        assert cell.ran and cell.verdict == BITWISE_INVARIANT, (name, cell.to_dict())
        assert cell.max_abs_delta_mnats == 0.0 and cell.positions > 0
    # A bit-identical repeat compares every position, as the forced decode does.
    assert by["forced_decode"].positions == by["repeat"].positions
    assert by["forced_decode"].schedule.knobs["force_mode"] == "decode"
    assert by["prefill"].schedule.knobs["force_mode"] == "prefill"


def test_batched_chunked_and_prefill_cells_run_and_are_compared(matrix: InvarianceResult) -> None:
    by = {c.schedule.cell: c for c in matrix.cells}
    assert by["batch"].schedule.knobs == {"batch_size": 4}
    assert by["chunked_prefill"].schedule.knobs == {"chunked_prefill": 4}
    for name in ("batch", "needle", "chunked_prefill", "prefill"):
        cell = by[name]
        assert cell.ran and cell.positions > 0, name
        assert cell.max_abs_delta_mnats is not None
        assert (cell.max_abs_delta_mnats == 0.0) == bool(cell.bitwise_identical), name
        if cell.verdict != VARIES:
            assert cell.token_flips["defect"] == 0
    assert by["needle"].prompts == 1
    assert matrix.baseline.knobs["batch_size"] == 1 and matrix.baseline.knobs["threads"] == "1"


def test_a_batch_of_one_is_the_one_prompt_loop(tiny: tuple[Path, Path]) -> None:
    from helpers.tiny_pin import MODEL, one_thread

    from gate.engines.hf.engine import HFEngine
    from gate.workflows.run.core import prompt_inputs

    weights, pins = tiny
    prompts = prompt_inputs(load_pin(MODEL, pins))[:3]
    with one_thread():
        plain = HFEngine(str(weights))
        batched = HFEngine(str(weights), batch_size="4")
        alone = [batched.generate([p], 5)[0] for p in prompts]
        together = batched.generate(prompts, 5)
        ref = plain.generate(prompts, 5)
    assert alone == ref  # a batch of one never pads: today's loop, bit for bit
    assert [r.id for r in together] == [p.id for p in prompts]
    for rec, p in zip(together, prompts, strict=True):
        assert rec.prompt_token_ids == p.prompt_token_ids and len(rec.token_ids) == p.max_tokens
        assert rec.top_logprobs is not None and len(rec.top_logprobs) == len(rec.token_ids)
        assert len(rec.token_logits or ()) == len(rec.token_ids)
