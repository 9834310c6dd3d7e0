"""MoE routers in a transformers model: record what they choose, and replay the oracle's choice.

Every router transformers 5.x ships for the MoE families below is a module (the MoE
block's `gate`) whose forward returns `(router_logits, routing_weights, expert_indices)`.
A forward hook on it reads the logits and the chosen experts of every token of each
forward, and may replace the choice (then it recomputes the routing weights the way that
router does). Hooks are installed only on a model that has such routers: a dense model
runs untouched.

- softmax routers (Qwen3-MoE `Qwen3MoeTopKRouter`, Qwen3.5/3.6 MoE `Qwen3_5MoeTopKRouter`,
  Mixtral `MixtralTopKRouter`, ...): the score of an expert is its router logprob,
  `log_softmax` of the float32 logits; weights are the softmax probabilities of the chosen
  experts, renormalised over them where the router does (`norm_topk_prob`).
- DeepSeek-V3-style routers (`DeepseekV3TopkRouter`, grouped top-k with a correction
  bias): the score is `sigmoid(logits) + e_score_correction_bias`, the value its top-k
  ranks; weights are the unbiased sigmoid scores of the chosen experts, renormalised
  when `norm_topk_prob`, times `routed_scaling_factor`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gate.core.traces.moe import SCORE_LOGPROB, SCORE_SIGMOID_BIAS

SOFTMAX = "softmax"
SIGMOID_BIAS = "sigmoid_bias"
# Router class -> (kind, whether it renormalises its top-k weights: True, False, or the
# name of the config attribute it reads).
ROUTERS: dict[str, tuple[str, bool | str]] = {
    "Qwen3MoeTopKRouter": (SOFTMAX, "norm_topk_prob"),
    "Qwen3_5MoeTopKRouter": (SOFTMAX, True),
    "Qwen3NextTopKRouter": (SOFTMAX, "norm_topk_prob"),
    "Qwen3VLMoeTextTopKRouter": (SOFTMAX, True),
    "Qwen2MoeTopKRouter": (SOFTMAX, "norm_topk_prob"),
    "OlmoeTopKRouter": (SOFTMAX, "norm_topk_prob"),
    "MixtralTopKRouter": (SOFTMAX, True),
    "DeepseekV3TopkRouter": (SIGMOID_BIAS, "norm_topk_prob"),
    "Glm4MoeTopkRouter": (SIGMOID_BIAS, "norm_topk_prob"),
}
# Router scores kept per token and layer beyond the top_k: enough to see the experts just
# below the cut, where a flip's substitute comes from.
SCORE_MARGIN = 4
TIE_BREAKS = ("lowest", "highest")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True, slots=True)
class Router:
    layer: int
    module: Any
    kind: str
    normalize: bool
    top_k: int
    num_experts: int


def find_routers(model: Any, named: Sequence[tuple[str, Any]] | None = None) -> list[Router]:
    """The model's MoE routers, by decoder layer index; empty for a dense model. `named`:
    the model's `named_modules()`, when the caller has them."""
    out: list[Router] = []
    for name, module in model.named_modules() if named is None else named:
        spec = ROUTERS.get(type(module).__name__)
        if spec is None:
            continue
        m = _LAYER.search(name)
        if m is None:
            continue
        kind, norm = spec
        normalize = bool(getattr(module, norm, False)) if isinstance(norm, str) else norm
        out.append(Router(int(m.group(1)), module, kind, normalize, int(module.top_k), int(module.num_experts)))
    out.sort(key=lambda r: r.layer)
    return out


class RouterHooks:
    """Forward hooks on every router of one model.

    Per forward (`begin(start, n)` then the model call then `take()`), each router's hook
    stores, for the forward's n tokens, the experts used ([n, top_k]) and the top
    `top_k + SCORE_MARGIN` scores ([n, m] ids and values). With `replay` rows set (the
    oracle's experts, [tokens, layers, top_k], indexed by input token), the hook uses those
    experts instead of its own for the tokens they cover. `tie_break="highest"` is a
    deliberate mutant: among equal router scores at the top-k's edge it takes the higher
    expert ids, as a top-k kernel with the other convention would.
    """

    def __init__(self, routers: Sequence[Router], *, tie_break: str = "lowest") -> None:
        self.routers = list(routers)
        self.tie_break = tie_break
        self.top_k = self.routers[0].top_k
        self.num_experts = self.routers[0].num_experts
        self.kind = self.routers[0].kind
        self.replay: Any = None  # list or array [tokens, layers, top_k], or None
        self.start = 0
        self._chosen: dict[int, torch.Tensor] = {}
        self._ids: dict[int, torch.Tensor] = {}
        self._scores: dict[int, torch.Tensor] = {}
        self.handles = [r.module.register_forward_hook(self._hook(i, r)) for i, r in enumerate(self.routers)]

    @property
    def layers(self) -> list[int]:
        return [r.layer for r in self.routers]

    @property
    def score_name(self) -> str:
        return SCORE_LOGPROB if self.kind == SOFTMAX else SCORE_SIGMOID_BIAS

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def begin(self, start: int) -> None:
        """The next forward's first input token index (0 for a prefill)."""
        self.start = start
        self._chosen.clear()
        self._ids.clear()
        self._scores.clear()

    def take(self) -> tuple[list[list[list[int]]], list[list[list[list[Any]]]]]:
        """The last forward's routing, per token then layer: (experts, [expert, score] pairs)."""
        n = len(self.routers)
        chosen = torch.stack([self._chosen[i] for i in range(n)], dim=1).tolist()  # [t, L, k]
        ids = torch.stack([self._ids[i] for i in range(n)], dim=1).tolist()
        scores = torch.stack([self._scores[i] for i in range(n)], dim=1).tolist()
        top = [
            [[[e, s] for e, s in zip(li, ls, strict=True)] for li, ls in zip(ti, ts, strict=True)]
            for ti, ts in zip(ids, scores, strict=True)
        ]
        return chosen, top

    def _hook(self, index: int, router: Router) -> Any:
        def hook(module: Any, args: Any, output: Any) -> Any:
            logits, weights, indices = output
            flat = logits.reshape(-1, logits.shape[-1]).float()
            if router.kind == SOFTMAX:
                scores = torch.log_softmax(flat, dim=-1)
            else:
                scores = torch.sigmoid(flat) + module.e_score_correction_bias.float()
            m = min(router.top_k + SCORE_MARGIN, router.num_experts)
            # Exact order: score descending, then expert id ascending (torch.topk is not
            # documented to order equal values).
            order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :m]
            self._ids[index] = order
            self._scores[index] = scores.gather(1, order)
            new = self._replacement(index, indices, scores)
            used = indices.reshape(-1, router.top_k).long() if new is None else new
            # Recorded in rank order (score descending, then id): DeepSeek-style routers
            # return their top-k unsorted.
            by_id = used.sort(dim=-1).values
            rank = torch.sort(scores.gather(1, by_id), dim=-1, descending=True, stable=True).indices
            self._chosen[index] = by_id.gather(1, rank)
            if new is None:
                return None
            return logits, self._weights(router, module, flat, new).to(weights.dtype), new.to(indices.dtype)

        return hook

    def _replacement(self, index: int, indices: torch.Tensor, scores: torch.Tensor) -> torch.Tensor | None:
        """The experts to use instead of the router's own, or None to keep its choice."""
        rows = indices.reshape(-1, indices.shape[-1]).long()
        new = None
        if self.tie_break == "highest":
            # Stable sort of the reversed row: among equal scores the highest id comes first.
            flipped = torch.sort(scores.flip(-1), dim=-1, descending=True, stable=True).indices
            new = (scores.shape[-1] - 1 - flipped[:, : rows.shape[1]]).long()
        if self.replay is not None:
            end = self.start + rows.shape[0]
            covered = min(end, len(self.replay)) - self.start
            if covered > 0:
                oracle = torch.as_tensor(
                    [entry[index] for entry in self.replay[self.start : self.start + covered]], dtype=torch.long
                )
                new = (new if new is not None else rows).clone()
                new[:covered] = oracle
        return new

    @staticmethod
    def _weights(router: Router, module: Any, logits: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """Routing weights of `experts` computed as `router` computes them for its own choice."""
        if router.kind == SOFTMAX:
            w = torch.softmax(logits, dim=-1).gather(1, experts)
            return w / w.sum(dim=-1, keepdim=True) if router.normalize else w
        w = torch.sigmoid(logits).gather(1, experts)
        if router.normalize:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return w * module.routed_scaling_factor
