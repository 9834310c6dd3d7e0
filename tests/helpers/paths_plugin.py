"""A plugin engine as an engine team writes one against gate's documented contract alone
(`gate.engine`): transformers underneath with a KV cache, no HFEngine; its weights found with
`model_folder` (the default model's folder is built on a fresh machine); teacher-forced decode
(`force`); and `gate diagnose`'s capture through either path (`capture_path`, `CapturesPaths`).

Options plant one bug, switchable as an engine team's tests switch theirs:
- `bug=mlp_scale`: the MLP output of layer `layer` (-1: every layer) times `scale` (1.05);
- `bug=drop_newest_kv`: every decode step attends to the cache without its newest entry
  (the step's own token), a decode-path bug the prefill never shows;
- `bug=none` (the default): the honest engine.
`dtype` (bfloat16) is the working dtype."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from gate.engine import (
    DECODE,
    PREFILL,
    Capture,
    ForcedDecode,
    InputError,
    PromptInput,
    PromptRecord,
    model_folder,
    parse_options,
)

BUGS = ("none", "mlp_scale", "drop_newest_kv")
OPTIONS: dict[str, tuple[type, Any]] = {
    "bug": (str, "none"),
    "layer": (int, -1),
    "scale": (float, 1.05),
    "dtype": (str, "bfloat16"),
}


class PathsPluginEngine:
    name = "paths-plugin"

    def __init__(self, model: str, /, **options: Any) -> None:
        opts = parse_options(self.name, options, OPTIONS)
        if opts["bug"] not in BUGS:
            raise InputError(f"--engine-opt bug={opts['bug']}: expected one of {', '.join(BUGS)}")
        self.bug = str(opts["bug"])
        self.model_path = str(model_folder(model))  # also the weights `gate diagnose` takes its reference from
        dtype = getattr(torch, opts["dtype"])
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, torch_dtype=dtype).eval()
        self.layers = list(self.model.model.layers)
        if self.bug == "mlp_scale":
            scale = float(opts["scale"])
            chosen = self.layers if opts["layer"] < 0 else [self.layers[opts["layer"]]]
            for layer in chosen:
                layer.mlp.register_forward_hook(lambda m, a, out: out * scale)

    # ------------------------------------------------------------------ the model's two paths

    def _prefill(self, ids: Sequence[int]) -> tuple[torch.Tensor, Any]:
        out = self.model(torch.tensor([list(ids)]), use_cache=True)
        return out.logits[0, -1].float(), out.past_key_values

    def _step(self, token: int, cache: Any) -> tuple[torch.Tensor, Any]:
        length = cache.get_seq_length()
        mask = torch.ones((1, length + 1), dtype=torch.long)
        if self.bug == "drop_newest_kv":
            mask[0, -1] = 0  # the step's own key and value, just written to the cache, are not attended to
        pos = torch.tensor([[length]])
        out = self.model(
            torch.tensor([[token]]), past_key_values=cache, attention_mask=mask, position_ids=pos, use_cache=True
        )
        return out.logits[0, -1].float(), out.past_key_values

    @staticmethod
    def _top(logits: torch.Tensor, top_k: int) -> tuple[int, list[list[Any]]]:
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = int(torch.argmax(logprobs))  # the first maximum: the lowest id among equals
        values, ids = torch.topk(logprobs, max(top_k, 1))
        top = sorted(((int(i), float(v)) for i, v in zip(ids, values, strict=True)), key=lambda x: (-x[1], x[0]))
        return chosen, [[i, v] for i, v in top[:top_k]]

    # ------------------------------------------------------------------ the contract

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "version": "0.1", "bug": self.bug}

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        out = []
        for p in prompts:
            tokens: list[int] = []
            tops: list[list[list[Any]]] = []
            with torch.inference_mode():
                logits, cache = self._prefill(p.prompt_token_ids)
                while True:
                    token, top = self._top(logits, top_k)
                    tokens.append(token)
                    tops.append(top)
                    if len(tokens) == p.max_tokens:
                        break
                    logits, cache = self._step(token, cache)
            out.append(PromptRecord(id=p.id, prompt_token_ids=p.prompt_token_ids, token_ids=tuple(tokens),
                                    top_logprobs=tops if top_k > 0 else None, finish_reason="length",
                                    prompt=p.prompt))  # fmt: skip
        return out

    def force(self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode:
        chosen: list[int] = []
        tops: list[list[list[Any]]] = []
        with torch.inference_mode():
            logits, cache = self._prefill(prompt_token_ids)
            for i, fed in enumerate(token_ids):
                token, top = self._top(logits, top_k)
                chosen.append(token)
                tops.append(top)
                if i + 1 < len(token_ids):
                    logits, cache = self._step(int(fed), cache)
        return ForcedDecode(tuple(chosen), tops if top_k > 0 else None, mode=DECODE)

    def encode(
        self, text: str | None = None, messages: Sequence[Mapping[str, str]] | None = None
    ) -> tuple[int, ...] | None:
        return None

    def decode_tokens(self, ids: Sequence[int]) -> list[str] | None:
        return None

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ gate diagnose, both paths

    def capture_path(self, prompt_token_ids: Sequence[int], context_token_ids: Sequence[int], path: str) -> Capture:
        """Every module's output at every context position: one forward over the context
        (prefill), or a forward over the prompt then one decode step per later context token
        through the KV cache (decode), exactly as `generate` runs them."""
        rows: dict[str, list[np.ndarray]] = {}
        with self._hooks(rows), torch.inference_mode():
            if path == PREFILL:
                self._prefill(context_token_ids)
            else:
                _, cache = self._prefill(prompt_token_ids)
                for token in context_token_ids[len(prompt_token_ids) :]:
                    _, cache = self._step(int(token), cache)
        arrays = {name: np.concatenate(chunks, axis=0) for name, chunks in rows.items()}
        return Capture.of_modules(path, len(context_token_ids), arrays)

    def _modules(self) -> Iterator[tuple[str, torch.nn.Module]]:
        yield "model.embed_tokens", self.model.model.embed_tokens
        for i, layer in enumerate(self.layers):
            yield f"model.layers.{i}.input_layernorm", layer.input_layernorm
            yield f"model.layers.{i}.self_attn", layer.self_attn
            yield f"model.layers.{i}.post_attention_layernorm", layer.post_attention_layernorm
            yield f"model.layers.{i}.mlp", layer.mlp
            yield f"model.layers.{i}", layer
        yield "model.norm", self.model.model.norm
        yield "lm_head", self.model.lm_head

    @contextmanager
    def _hooks(self, rows: dict[str, list[np.ndarray]]) -> Iterator[None]:
        def keep(name: str) -> Any:
            def hook(module: Any, args: Any, output: Any) -> None:
                tensor = output[0] if isinstance(output, tuple) else output
                rows.setdefault(name, []).append(tensor[0].float().numpy().copy())

            return hook

        handles = [module.register_forward_hook(keep(name)) for name, module in self._modules()]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
