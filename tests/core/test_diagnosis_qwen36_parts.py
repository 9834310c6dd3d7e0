"""Qwen3.5/3.6's sub-parts as capture points: their module names map to their parts (a dump or a
plugin names them so), a report words them as the model's users do, and a dense model's names
and words are what they were."""

from __future__ import annotations

import pytest

from gate.core.diagnosis.capture import PARTS, Point, point_of_module
from gate.core.diagnosis.record import LayerError, where_text

L = "model.language_model.layers.2"


@pytest.mark.parametrize(
    ("module", "part", "words"),
    [
        (f"{L}.linear_attn.conv1d", "linear_attention.conv1d", "layer 2, linear attention: conv1d"),
        (f"{L}.linear_attn.delta_rule", "linear_attention.delta_rule", "layer 2, linear attention: gated delta rule"),
        (f"{L}.linear_attn.in_proj_z", "linear_attention.output_gate", "layer 2, linear attention: output gate (z)"),
        (f"{L}.linear_attn.norm", "linear_attention.norm", "layer 2, linear attention: gated RMSNorm (norm)"),
        (f"{L}.linear_attn", "linear_attention", "layer 2, linear attention: out_proj"),
        (f"{L}.self_attn.output_gate", "attention.output_gate", "layer 2, attention: output gate"),
        (f"{L}.mlp.gate.choice", "router.choice", "layer 2, MoE router: chosen experts"),
        (f"{L}.mlp.experts", "experts.routed", "layer 2, MoE: routed experts"),
        (f"{L}.mlp.shared_expert", "experts.shared", "layer 2, MoE: shared expert"),
        (f"{L}.mlp.shared_expert_gate", "experts.shared_gate", "layer 2, MoE: shared expert's sigmoid gate"),
        (f"{L}.mlp.shared_expert.gated", "experts.shared_gated", "layer 2, MoE: shared expert × its sigmoid gate"),
    ],
)
def test_a_sub_part_name_is_its_point_and_its_words(module: str, part: str, words: str) -> None:
    assert part in PARTS
    assert point_of_module(module, 4) == Point(2, part, module)
    assert where_text(LayerError(2, part, module, 1.0, 0.1, 10.0, 5), 4) == words


@pytest.mark.parametrize(
    ("module", "part", "words"),
    [
        ("model.layers.9.self_attn", "attention", "layer 9, attention"),
        ("model.layers.9.mlp", "mlp", "layer 9, mlp"),
        ("model.layers.9.input_layernorm", "norm", "layer 9, norm"),
        ("model.layers.9", "residual", "layer 9, residual"),
        ("model.layers.9.mlp.gate", "router", "layer 9, router"),
    ],
)
def test_a_dense_models_names_and_words_are_unchanged(module: str, part: str, words: str) -> None:
    assert point_of_module(module, 30) == Point(9, part, module)
    assert where_text(LayerError(9, part, module, 1.0, 0.1, 10.0, 5), 30) == words
    assert point_of_module("model.layers.9.self_attn.q_proj", 30) is None
