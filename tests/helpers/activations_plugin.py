"""A plugin engine as a third party writes one against gate's documented contract alone
(`gate.engine`): transformers underneath, no HFEngine, and `gate diagnose`'s capture through
`capture_activations` (forward hooks of its own). It has no `force`: an optional capability.

Options: `layer` (int, -1: none) plants a bug, that layer's attention output projection
loaded transposed; `dtype` (bfloat16) the working dtype."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from gate.engine import PromptInput, PromptRecord, parse_options

OPTIONS: dict[str, tuple[type, Any]] = {"layer": (int, -1), "dtype": (str, "bfloat16")}


class ActivationsPluginEngine:
    name = "activations-plugin"

    def __init__(self, model: str, /, **options: Any) -> None:
        opts = parse_options(self.name, options, OPTIONS)
        self.model_path = model  # the weights `gate diagnose` runs its reference on
        self.model = AutoModelForCausalLM.from_pretrained(model, torch_dtype=getattr(torch, opts["dtype"])).eval()
        if opts["layer"] >= 0:
            o_proj = self.model.model.layers[opts["layer"]].self_attn.o_proj
            with torch.no_grad():
                o_proj.weight.copy_(o_proj.weight.t().contiguous())

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "version": "0.1"}

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        out = []
        for p in prompts:
            ids = list(p.prompt_token_ids)
            with torch.inference_mode():
                for _ in range(p.max_tokens):
                    logits = self.model(torch.tensor([ids])).logits[0, -1].float()
                    ids.append(int(torch.argmax(logits)))
            new = tuple(ids[len(p.prompt_token_ids) :])
            out.append(PromptRecord(id=p.id, prompt_token_ids=p.prompt_token_ids, token_ids=new, top_logprobs=None,
                                    finish_reason="length", prompt=p.prompt))  # fmt: skip
        return out

    def encode(
        self, text: str | None = None, messages: Sequence[Mapping[str, str]] | None = None
    ) -> tuple[int, ...] | None:
        return None

    def decode_tokens(self, ids: Sequence[int]) -> list[str] | None:
        return None

    def close(self) -> None:
        pass

    def capture_activations(
        self, context_token_ids: Sequence[int], names: Sequence[str] | None = None
    ) -> Mapping[str, np.ndarray]:
        """The residual stream after each decoder layer, its attention and its MLP."""
        seen: dict[str, np.ndarray] = {}
        hooks = []
        for i, layer in enumerate(self.model.model.layers):
            for name, module in ((f"model.layers.{i}", layer), (f"model.layers.{i}.self_attn", layer.self_attn),
                                 (f"model.layers.{i}.mlp", layer.mlp)):  # fmt: skip
                if names is None or name in names:
                    hooks.append(module.register_forward_hook(self._keep(seen, name)))
        try:
            with torch.inference_mode():
                self.model(torch.tensor([list(context_token_ids)]))
        finally:
            for h in hooks:
                h.remove()
        return seen

    @staticmethod
    def _keep(seen: dict[str, np.ndarray], name: str) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            tensor = output[0] if isinstance(output, tuple) else output
            seen[name] = tensor[0].float().numpy()

        return hook
