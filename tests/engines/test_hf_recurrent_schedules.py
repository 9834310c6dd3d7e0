"""The HF engine's schedules on a hybrid model with recurrent state (slow: loads a model).

The tiny Qwen3.5-MoE (3 Gated DeltaNet layers + 1 gated attention layer, float32) holds a
conv and a recurrent state per DeltaNet layer that no crop puts back to an earlier token.
Each schedule that reuses or continues a cache (the prefix cache, the chunked prefill, the
forced decode in one prefill) must give the plain prefill's logits within float32 rounding;
the same schedule with a stale state (a kept prompt's state reused past the branch point, a
chunk started from a fresh state) is far outside that, so each comparison can fail.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

# float32 rounding between two schedules of one model; a stale state moves logits by units.
ROUNDING = 2e-3
STALE = 0.1
# transformers' chunked gated delta rule works in chunks of 64 tokens (torch_chunk_gated_delta_rule).
DELTA_CHUNK = 64


@pytest.fixture(scope="module")
def hybrid_path(tiny_models_dir: Path) -> Path:
    from helpers.tiny_models import build_tiny_qwen3_5_moe

    return build_tiny_qwen3_5_moe(tiny_models_dir / "qwen3.5-moe-f32", seed=2, dtype="float32", lm_head_scale=20.0)


@pytest.fixture(scope="module")
def plain(hybrid_path: Path) -> Any:
    from gate.engines.hf.engine import HFEngine

    return HFEngine(str(hybrid_path), dtype="float32", record_routing=False, tokenizer=False)


def prefill(engine: Any, ids: Sequence[int]) -> Any:
    with torch.inference_mode():
        logits, _ = engine._prefill(list(ids))
    return logits.float()


def gap(a: Any, b: Any) -> float:
    return float((a - b).abs().max())


# Three prompts branching from one shared head at two points, then the first again.
HEAD = list(range(40, 70))
A = [*HEAD, *range(100, 120)]
B = [*HEAD, *range(130, 141)]
C = [*HEAD, *range(150, 163)]
D = [*HEAD, *range(130, 136), *range(200, 209)]  # shares B's first 6 tokens after the head


def test_the_hybrid_cache_cannot_be_cropped_so_the_prefix_cache_reuses_snapshots(hybrid_path: Path, plain: Any) -> None:
    from gate.engines.hf.engine import HFEngine
    from gate.engines.hf.schedules import croppable

    engine = HFEngine(str(hybrid_path), dtype="float32", record_routing=False, prefix_cache=True, tokenizer=False)
    store = engine.prefix_store
    for prompt in (A, B, C, D, A, B):
        assert gap(prefill(engine, prompt), prefill(plain, prompt)) < ROUNDING, prompt[len(HEAD) :]
    assert store.recurrent
    held = dict(store.entries)
    assert not croppable(held[tuple(A)])
    # B branched from A after the head: the head's state was kept as an entry of its own, which
    # C, D and A again then reused as it is; D kept its branch point with B, which B again reused.
    assert tuple(HEAD) in held and tuple(B[: len(HEAD) + 6]) in held, [len(k) for k in held]
    assert store.hits == 4 and store.reused_tokens == 3 * len(HEAD) + len(HEAD) + 6


def test_a_stale_recurrent_state_is_far_from_the_plain_prefill(hybrid_path: Path, plain: Any) -> None:
    """The mutant of the prefix cache above: B's rest fed through A's whole cache (the state
    after A's tail, which a KV cache would have cropped) misses B's logits by far more than
    rounding; and transformers refuses the crop itself."""
    from gate.engines.hf.engine import HFEngine

    engine = HFEngine(str(hybrid_path), dtype="float32", record_routing=False, tokenizer=False)
    with torch.inference_mode():
        _, cache = engine._prefill(A)
        with pytest.raises(RuntimeError, match="does not track past states"):
            cache.crop(len(HEAD))
        rest = torch.tensor([B[len(HEAD) :]], dtype=torch.long)
        stale = engine.model(input_ids=rest, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
    assert gap(stale.float(), prefill(plain, B)) > STALE


@pytest.mark.parametrize("chunk", [7, DELTA_CHUNK])
def test_a_chunked_prefill_across_the_delta_rules_chunk_boundary_is_the_plain_prefill(
    hybrid_path: Path, plain: Any, chunk: int
) -> None:
    """A prompt of 90 tokens: past the gated delta rule's own 64-token chunk inside one forward,
    and chunked by the engine in 7s (the state carried across 12 forwards) or at 64."""
    from gate.engines.hf.engine import HFEngine

    prompt = [(7 * i + 3) % 250 for i in range(90)]
    engine = HFEngine(str(hybrid_path), dtype="float32", record_routing=False, prefill_chunk=chunk, tokenizer=False)
    assert gap(prefill(engine, prompt), prefill(plain, prompt)) < ROUNDING


def test_a_chunk_started_from_a_fresh_state_is_far_from_the_plain_prefill(plain: Any) -> None:
    """The chunked prefill's mutant: the last chunk run without the state of the ones before."""
    prompt = [(7 * i + 3) % 250 for i in range(90)]
    with torch.inference_mode():
        fresh = plain.model(input_ids=torch.tensor([prompt[DELTA_CHUNK:]]), use_cache=True, logits_to_keep=1)
    assert gap(fresh.logits[0, -1].float(), prefill(plain, prompt)) > STALE


def test_forced_decode_in_one_prefill_is_the_step_by_step_decode(hybrid_path: Path, plain: Any) -> None:
    from gate.core.engine import PromptInput
    from gate.engines.hf.engine import HFEngine

    [own] = plain.generate([PromptInput(id="p", prompt_token_ids=tuple(A), max_tokens=12)], 5)
    stepped = plain.force(A, own.token_ids, 5)
    assert stepped.token_ids == own.token_ids  # the decode path along its own tokens, bit for bit
    engine = HFEngine(str(hybrid_path), dtype="float32", record_routing=False, force_mode="prefill", tokenizer=False)
    at_once = engine.force(A, own.token_ids, 5)
    assert at_once.token_ids == own.token_ids
    one = [lp for pairs in stepped.top_logprobs or [] for _, lp in pairs]
    other = [lp for pairs in at_once.top_logprobs or [] for _, lp in pairs]
    assert len(one) == len(other) and max(abs(x - y) for x, y in zip(one, other, strict=True)) < ROUNDING


def test_the_prefix_cache_keeps_its_last_size_prompts() -> None:
    """Eight entries are eight: the store once kept only the last few of fewer than `size`."""
    from gate.engines.hf.schedules import PrefixCache

    store = PrefixCache(size=8)
    for i in range(10):
        store.keep((i, i + 1), f"cache {i}")
        assert [kept for kept, _ in store.entries] == [(j, j + 1) for j in range(max(0, i - 7), i + 1)]
