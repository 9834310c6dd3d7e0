"""A calibration mutant for models with recurrent state: the stale-state engine.

`StaleRecurrentStateHFEngine` is the HF engine with one serving bug planted: its recurrent
state slot is not cleared between requests. Every prompt's prefill after the first starts
from the conv and recurrent states the previous request left in the model's recurrent layers
(a Gated DeltaNet's `LinearAttentionLayer`s in Qwen3.5/3.6), while its attention layers' KV
is emptied, so positions are right and only the carried-over state is wrong: the fault of a
server that reuses a slot without resetting its recurrent memory.

It is honest on its first request, and on a model without recurrent layers (every layer is a
full-attention `DynamicLayer`, emptied each time): `schedules.has_recurrent_layers` says
which. `gate selftest` plants it where the model has such layers (`stale-recurrent-state`), and
`gate invariance --engine gate.engines.hf.stale_state:StaleRecurrentStateHFEngine` must find
its repeat and shuffle cells varying (tests/workflows/test_invariance_hybrid.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gate.engines.hf.engine import HFEngine


class StaleRecurrentStateHFEngine(HFEngine):
    """The HF engine whose recurrent state slot keeps the previous request's conv and
    recurrent states (see the module doc). Options: the HF engine's."""

    name = "hf-stale-recurrent-state"

    def __init__(self, model: str, /, **options: Any) -> None:
        super().__init__(model, **options)
        self.slot: Any = None

    def _prefill(self, prompt_ids: Sequence[int]) -> tuple[torch.Tensor, Any]:
        from transformers.cache_utils import DynamicLayer

        cache = self.slot
        if cache is None:
            logits, cache = super()._prefill(prompt_ids)
        else:
            for layer in cache.layers:
                if isinstance(layer, DynamicLayer) and layer.get_seq_length() > 0:
                    layer.crop(-layer.get_seq_length())  # the attention layers' KV emptied, the state kept
            ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.device)
            self._seq = 0
            out = self._forward(ids, input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            logits, cache = out.logits[0, -1], out.past_key_values
        self.slot = cache
        return logits, cache

    def info(self) -> dict[str, Any]:
        return {**super().info(), "mutation": "recurrent state carried over from the previous request"}
