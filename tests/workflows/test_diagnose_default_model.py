"""`gate diagnose` on the default model (SmolLM2-135M, 30 layers): a planted attention bug in
layer 9 and the self-test's skip-layer mutant (layer 15) are located at their layers; one
reference and one honest engine for the module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def default() -> Iterator[tuple[str, Any, Any, Any]]:
    from helpers.requirements import require_distribution
    from helpers.tiny_pin import one_thread

    from gate.core.pins.pin import load_pin
    from gate.models.default import DEFAULT_MODEL, GGUF_DISTRIBUTION, resolve_model_path
    from gate.workflows.diagnose.core import reference_engines, target_given

    require_distribution(GGUF_DISTRIBUTION, "the default model's GGUF")
    path = resolve_model_path(DEFAULT_MODEL)
    target = target_given(load_pin(DEFAULT_MODEL), "chat-haiku", 12)
    with one_thread(), reference_engines(path) as (ref, hon):
        yield path, target, ref, hon


def run(default: tuple[str, Any, Any, Any], engine: Any) -> Any:
    from gate.engines.hf.capture import capture_hf
    from gate.workflows.diagnose.core import capturer_for, diagnose

    _, target, ref, hon = default
    return diagnose(
        target,
        capturer_for(engine),
        lambda p, c, pa: capture_hf(ref, p, c, pa),
        lambda p, c, pa: capture_hf(hon, p, c, pa),
        both_paths=False,
    )


def test_a_planted_attention_bug_in_layer_9_is_located_there(default: tuple[str, Any, Any, Any]) -> None:
    from helpers.planted_engines import AttentionBug

    d = run(default, AttentionBug(default[0], layer="9"))
    assert d.finding.first is not None, d.summary
    assert (d.finding.first.layer, d.finding.first.part) == (9, "attention"), d.summary
    assert d.summary.startswith("enters at layer 9, attention, decode path: ")


def test_the_skip_layer_mutant_is_located_at_its_layer(default: tuple[str, Any, Any, Any]) -> None:
    from gate.engines.hf.mutants import LayerSkippedHFEngine

    d = run(default, LayerSkippedHFEngine(default[0]))
    assert d.finding.first is not None and d.finding.first.layer == 15, d.summary
