"""The doctrine study's realistic candidates (`gate.engines.hf.mutants.realistic_mutations`) do
what they say, on a tiny random Llama: quantised weights are on their integer grid, the KV
cache is read back through its round trip, the decode path alone is shifted, confined biases
stay confined, and the penalised sampler chooses apart from the logprobs it reports.

One slow test (it loads a tiny model a few times): the study itself runs them on the real one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_realistic_candidates_alter_what_they_say(tmp_path: Path) -> None:
    import torch
    from helpers.tiny_models import build_tiny_llama
    from helpers.tiny_pin import one_thread

    from gate.core.engine import PromptInput
    from gate.engines.hf.engine import HFEngine
    from gate.engines.hf.layers import decoder_layers
    from gate.engines.hf.mutants import (
        ConfinedRunnerUpHFEngine,
        DecodePositionShiftedHFEngine,
        KVQuantisedHFEngine,
        PenalisedSamplerHFEngine,
        WeightQuantisedHFEngine,
        fp8_round_trip,
        int8_round_trip,
        prompt_selected,
        quantise_rows,
        realistic_mutations,
    )

    weights = str(build_tiny_llama(tmp_path / "w", seed=3, lm_head_scale=20.0))
    prompt = PromptInput(id="p", prompt_token_ids=(72, 101, 108, 108, 111, 32, 119), max_tokens=20)
    with one_thread():
        plain = HFEngine(weights)
        base = plain.generate([prompt], 8)[0]
        base_forced = plain.force(prompt.prompt_token_ids, base.token_ids, 8)

        # int8 per output channel: in float32 every row is an integer multiple of its own scale;
        # the engine's bf16 weights moved by at most half a step (and a bf16 rounding).
        x = torch.randn(4, 64)
        scale = x.abs().amax(dim=1, keepdim=True) / 127
        assert torch.allclose(quantise_rows(x, 8, None) / scale, torch.round(x / scale), atol=1e-3)
        q8 = WeightQuantisedHFEngine(weights, bits=8)

        def first_linear(engine: HFEngine) -> torch.Tensor:
            layer = next(m for m in decoder_layers(engine.model).modules() if isinstance(m, torch.nn.Linear))
            return layer.weight.detach().float()

        w, w0 = first_linear(q8), first_linear(plain)
        step = w0.abs().amax(dim=1, keepdim=True) / 127
        assert not torch.equal(w, w0)
        assert bool(((w - w0).abs() <= step / 2 + w0.abs() / 128).all())
        assert q8.info()["mutation"].endswith("int8 per output channel")
        assert q8.force(prompt.prompt_token_ids, base.token_ids, 8).top_logprobs != base_forced.top_logprobs
        assert torch.unique(quantise_rows(x, 4, 32).reshape(4, 2, 32)[0, 0]).numel() <= 15  # 4 bits: 15 levels

        # The KV cache through fp8 / int8: logits move; the round trips are lossy and idempotent.
        v = torch.randn(2, 3, 5, 64, dtype=torch.bfloat16)
        assert not torch.equal(fp8_round_trip(v), v) and not torch.equal(int8_round_trip(v), v)
        assert torch.equal(fp8_round_trip(fp8_round_trip(v)), fp8_round_trip(v))
        kv = KVQuantisedHFEngine(weights, kv="fp8")
        assert kv.force(prompt.prompt_token_ids, base.token_ids, 8).top_logprobs != base_forced.top_logprobs

        # A decode-path position shift leaves the prefill (position 0) alone.
        shifted = DecodePositionShiftedHFEngine(weights, shift=1)
        sf = shifted.force(prompt.prompt_token_ids, base.token_ids, 8)
        assert sf.top_logprobs is not None and base_forced.top_logprobs is not None
        assert sf.top_logprobs[0] == base_forced.top_logprobs[0]
        assert sf.top_logprobs[1:] != base_forced.top_logprobs[1:]

        # A late bias: positions before 16 untouched, later ones moved.
        late = ConfinedRunnerUpHFEngine(weights, steps=3, from_position=16)
        lf = late.force(prompt.prompt_token_ids, base.token_ids, 8)
        assert lf.top_logprobs is not None
        assert lf.top_logprobs[:16] == base_forced.top_logprobs[:16]
        assert lf.top_logprobs[16:] != base_forced.top_logprobs[16:]
        # A bias on some prompts: chosen by the prompt's ids, the same in the free run and in forcing.
        some = ConfinedRunnerUpHFEngine(weights, steps=3, every=3)
        ids = [(*prompt.prompt_token_ids, 97 + k) for k in range(12)]
        picked = [next(i for i in ids if prompt_selected(i, 3)), next(i for i in ids if not prompt_selected(i, 3))]
        for p_ids, selected in zip(picked, (True, False), strict=True):
            toks = plain.generate([PromptInput(id="q", prompt_token_ids=p_ids, max_tokens=6)], 8)[0].token_ids
            own = plain.force(p_ids, toks, 8).top_logprobs
            assert (some.force(p_ids, toks, 8).top_logprobs != own) == selected

        # The penalised sampler reports the plain engine's lists but does not always choose their top.
        pen = PenalisedSamplerHFEngine(weights, penalty=1.5)
        pf = pen.force(prompt.prompt_token_ids, base.token_ids, 8)
        assert pf.top_logprobs == base_forced.top_logprobs
        assert pf.token_ids != base_forced.token_ids

    names = [m.name for m in realistic_mutations(weights, {})]
    assert names == [
        "weights-int8",
        "weights-int4",
        "kv-fp8",
        "kv-int8",
        "decode-position+1",
        "runner-up+3-late",
        "runner-up+3-some-prompts",
        "penalised-sampler",
    ]
