"""A planted Gated DeltaNet fault for the HF engine, as a plugin ships one: layer 0's
`linear_attn.out_proj` scaled by 1.5 after loading (the weights on disk, and so their hash,
stay the pin's). `--engine helpers.planted_deltanet:DeltaNetOutScale`."""

from __future__ import annotations

from typing import Any

import torch

from gate.engines.hf.engine import HFEngine
from gate.engines.hf.layers import decoder_layers


class DeltaNetOutScale(HFEngine):
    name = "planted-deltanet-out-scale"

    def __init__(self, model: str, **options: Any) -> None:
        super().__init__(model, **options)
        out_proj = decoder_layers(self.model)[0].linear_attn.out_proj
        with torch.no_grad():
            out_proj.weight.mul_(1.5)
