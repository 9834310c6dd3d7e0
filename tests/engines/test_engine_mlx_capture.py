"""The MLX engine's capture for `gate diagnose` (gate/engines/mlx/capture.py), on a tiny MLX
llama: its logits are the engine's own, bit for bit, on either path; the parts recompose,
layer by layer in MLX's own bfloat16 arithmetic, into the next residual stream exactly (so
each name holds what it says); the engine is left as it was; a planted MLP bug shows at its
layer and part and nowhere before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("mlx_lm")

import mlx.core as mx
import numpy as np
from helpers.mlx_planted import PlantedMLXEngine
from helpers.tiny_mlx import build_tiny_mlx_llama

from gate.core.engine import CapturesActivations, CapturesPaths
from gate.engines.mlx.engine import MLXEngine
from gate.errors import InputError
from gate.workflows.diagnose.core import PATHS_KIND, capture_kind

TEXT = "The capital of France is"
FED = (72, 101, 108, 108, 111)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_mlx_llama(tmp_path_factory.mktemp("tiny-mlx-capture") / "m")


@pytest.fixture(scope="module")
def engine(folder: Path) -> Iterator[MLXEngine]:
    e = MLXEngine(str(folder), prefill_step_size="4")  # the prompt's prefill in several chunks
    yield e
    e.close()


def ids(engine: MLXEngine) -> tuple[list[int], list[int]]:
    prompt = list(engine.encode(TEXT) or ())
    return prompt, prompt + list(FED)


def own_decode_logits(engine: MLXEngine, prompt: list[int], context: list[int]) -> np.ndarray:
    """The engine's own decode loop's logits at each position from the prompt's last on."""
    rows = []
    cache, logits = engine._prefill(prompt)
    rows.append(np.array(logits.astype(mx.float32)))
    for token in context[len(prompt) :]:
        logits = engine._step(mx.array([token], dtype=mx.uint32), cache)
        rows.append(np.array(logits.astype(mx.float32)))
    return np.concatenate(rows, axis=0)


def test_the_mlx_engine_captures_through_either_path_by_the_protocols() -> None:
    assert issubclass(MLXEngine, CapturesPaths) and issubclass(MLXEngine, CapturesActivations)
    assert capture_kind(MLXEngine) == PATHS_KIND


def test_the_captured_logits_are_the_engines_own_bit_for_bit(engine: MLXEngine) -> None:
    prompt, context = ids(engine)
    decode = engine.capture_path(prompt, context, "decode").by_module()["lm_head"]
    assert decode.positions == tuple(range(len(context)))
    want = own_decode_logits(engine, prompt, context)
    assert np.array_equal(decode.values[len(prompt) - 1 :], want)
    prefill = engine.capture_path(prompt, context, "prefill").by_module()["lm_head"]
    whole = engine.model(mx.array(context, dtype=mx.uint32)[None])[0]
    assert np.array_equal(prefill.values, np.array(whole.astype(mx.float32)))
    # forced decode over the context's tokens reads the same rows: its picks' raw logits are there
    forced = engine.force(prompt, [*context[len(prompt) :], 0], 0)
    rows = decode.values[len(prompt) - 1 :]
    assert forced.extra["token_logits"] == [float(r[t]) for r, t in zip(rows, forced.token_ids, strict=True)]


@pytest.mark.parametrize("path", ["prefill", "decode"])
def test_the_parts_recompose_layer_by_layer_into_the_engines_output(engine: MLXEngine, path: str) -> None:
    """A forward rebuilt from the capture, in MLX bfloat16: each layer's input norm and
    post-attention norm of the residual stream, the residual plus the attention, plus the MLP,
    the final norm and lm_head: every step equals the captured next point exactly."""
    prompt, context = ids(engine)
    cap = {
        k: mx.array(t.values).astype(mx.bfloat16)
        for k, t in engine.capture_path(prompt, context, path).by_module().items()
    }
    model = engine.model
    x = cap["model.embed_tokens"]
    assert mx.array_equal(x, model.model.embed_tokens(mx.array(context, dtype=mx.uint32)))
    for i, layer in enumerate(model.model.layers):
        name = f"model.layers.{i}"
        assert mx.array_equal(layer.input_layernorm(x), cap[f"{name}.input_layernorm"]), name
        h = x + cap[f"{name}.self_attn"]
        assert mx.array_equal(layer.post_attention_layernorm(h), cap[f"{name}.post_attention_layernorm"]), name
        assert mx.array_equal(layer.mlp(cap[f"{name}.post_attention_layernorm"]), cap[f"{name}.mlp"]), name
        x = h + cap[f"{name}.mlp"]
        assert mx.array_equal(x, cap[name]), name
    assert mx.array_equal(model.model.norm(x), cap["model.norm"])
    assert mx.array_equal(model.lm_head(cap["model.norm"]), cap["lm_head"])


def test_a_capture_leaves_the_engine_as_it_was(folder: Path) -> None:
    e = MLXEngine(str(folder), prefix_cache="true")
    prompt, context = ids(e)
    from gate.core.engine import PromptInput

    p = PromptInput("p", tuple(prompt), 8)
    before = e.generate([p], 3)[0]
    model, cached = e.model, list(e._cached)
    for path in ("decode", "prefill"):
        cap = e.capture_path(prompt, context, path)
        assert all(t.positions == tuple(range(len(context))) for t in cap.tensors), path  # nothing reused
    assert e.model is model and e._cached == cached
    layer = model.model.layers[0]
    assert type(layer).__name__ == "TransformerBlock" and type(layer.mlp).__name__ == "MLP"
    assert "mlp" in layer and "mlp" not in vars(layer)
    assert e.generate([p], 3)[0] == before


def test_capture_activations_is_the_prefill_capture_by_name(engine: MLXEngine) -> None:
    prompt, context = ids(engine)
    cap = engine.capture_path(prompt, context, "prefill").by_module()
    named = engine.capture_activations(context, ["model.layers.1.mlp", "lm_head", "not.a.module"])
    assert sorted(named) == ["lm_head", "model.layers.1.mlp"]
    for name, values in named.items():
        assert values.dtype == np.float32 and np.array_equal(values, cap[name].values), name
    assert len(engine.capture_activations(context)) == len(cap)


def test_a_bad_path_or_context_is_refused_naming_it(engine: MLXEngine) -> None:
    prompt, context = ids(engine)
    with pytest.raises(InputError, match="sideways"):
        engine.capture_path(prompt, context, "sideways")
    with pytest.raises(InputError, match="start with the"):
        engine.capture_path([1, 2], context, "decode")


def test_a_planted_mlp_bug_shows_at_its_layer_and_part_and_nowhere_before(folder: Path, engine: MLXEngine) -> None:
    planted = PlantedMLXEngine(str(folder), prefill_step_size="4", scale_mlp="1:1.5")
    prompt, context = ids(engine)
    for path in ("prefill", "decode"):
        honest = engine.capture_path(prompt, context, path)
        bad = planted.capture_path(prompt, context, path).by_module()
        differs = [t.point.module for t in honest.tensors if not np.array_equal(t.values, bad[t.point.module].values)]
        assert differs[0] == "model.layers.1.mlp", (path, differs)
        assert np.allclose(
            bad["model.layers.1.mlp"].values, 1.5 * honest.by_module()["model.layers.1.mlp"].values, rtol=1e-2
        )
