"""A Llama-family decoder with a static KV cache in its own buffers, for `torch.export`.

`StaticCacheDecoder(model, max_seq_len)` wraps a transformers Llama-family causal LM (its own
embedding, norms, projections, MLPs, rotary embedding and lm_head modules, so the weights
and every sub-computation are the checkpoint's) and adds one thing the exported program
needs: key and value buffers of a fixed shape `[1, kv_heads, max_seq_len, head_dim]` per
layer, written in place at the given cache positions (`cache[:, :, positions] = k`, an
`index_put`, as ExecuTorch's own Llama KV cache does). `forward(input_ids [1, seq],
cache_position [seq]) -> logits [1, seq, vocab]` attends each query to the cache rows at or
before its own position (a boolean causal mask row per position), so rows left over from an
earlier, longer prompt are never read. One call can prefill a whole prompt (seq > 1) or
decode one token.

`CustomOpsDecoder(model, max_seq_len)` is the same decoder with ExecuTorch's own LLM
operators in the attention (`executorch.extension.llm.custom_ops`, as ExecuTorch's Llama
export uses them): `llama.update_cache` writes the new keys and values into caches of shape
`[1, max_seq_len, kv_heads, head_dim]` at the call's first cache position, and
`llama.custom_sdpa` attends each query causally to cache rows 0..its own position only, so
a decode step reads the rows written so far, not all `max_seq_len` of them. Its cache
positions must be consecutive (as gate's loop calls it: a prompt from 0, then one token at
the next position).

Architectures: those whose decoder layer is Llama's (pre-norm attention with q/k/v/o
projections, biases allowed, rotary embedding, grouped-query attention, no q/k norms, no
sliding window): Llama, Mistral without a window, Qwen2. Others are refused by name.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

SUPPORTED = ("llama", "mistral", "qwen2")


class _Decoder(torch.nn.Module):
    """The checks and sizes both decoders share."""

    def __init__(self, model: Any, max_seq_len: int) -> None:
        super().__init__()
        config = model.config
        if config.model_type not in SUPPORTED:
            raise ValueError(f"model type {config.model_type!r}: the ExecuTorch export supports {', '.join(SUPPORTED)}")
        window = getattr(config, "sliding_window", None)
        if window and getattr(config, "use_sliding_window", True) and window < max_seq_len:
            raise ValueError(f"a sliding window ({window}) shorter than max_seq_len is not supported by the export")
        self.model = model
        self.max_seq_len = max_seq_len
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.layers = int(config.num_hidden_layers)


class StaticCacheDecoder(_Decoder):
    causal: torch.Tensor  # a buffer: the causal mask table, [max_seq_len, max_seq_len] bool

    def __init__(self, model: Any, max_seq_len: int) -> None:
        super().__init__(model, max_seq_len)
        for i in range(self.layers):
            shape = (1, self.kv_heads, max_seq_len, self.head_dim)
            self.register_buffer(f"k_cache_{i}", torch.zeros(shape, dtype=torch.float32), persistent=False)
            self.register_buffer(f"v_cache_{i}", torch.zeros(shape, dtype=torch.float32), persistent=False)
        causal = torch.tril(torch.ones(max_seq_len, max_seq_len, dtype=torch.bool))
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        inner = self.model.model
        seq = input_ids.shape[1]
        hidden = inner.embed_tokens(input_ids)
        cos, sin = inner.rotary_emb(hidden, cache_position.unsqueeze(0))
        # Row p of the causal table: cache rows 0..p visible, later rows (stale or empty) not.
        mask = self.causal[cache_position].unsqueeze(0).unsqueeze(0)
        group = self.heads // self.kv_heads
        for i, layer in enumerate(inner.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attn.q_proj(x).view(1, seq, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(1, seq, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(1, seq, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k_cache, v_cache = getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}")
            k_cache[:, :, cache_position] = k
            v_cache[:, :, cache_position] = v
            keys = k_cache.repeat_interleave(group, dim=1) if group > 1 else k_cache
            values = v_cache.repeat_interleave(group, dim=1) if group > 1 else v_cache
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            hidden = hidden + attn.o_proj(out.transpose(1, 2).reshape(1, seq, self.heads * self.head_dim))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.model.lm_head(inner.norm(hidden))


class CustomOpsDecoder(_Decoder):
    """The decoder with `llama.update_cache` and `llama.custom_sdpa` (see the module doc);
    `executorch.extension.llm.custom_ops` must be imported first (it registers them)."""

    def __init__(self, model: Any, max_seq_len: int) -> None:
        super().__init__(model, max_seq_len)
        for i in range(self.layers):
            shape = (1, max_seq_len, self.kv_heads, self.head_dim)  # the custom ops' [batch, seq, heads, dim]
            self.register_buffer(f"k_cache_{i}", torch.zeros(shape, dtype=torch.float32), persistent=False)
            self.register_buffer(f"v_cache_{i}", torch.zeros(shape, dtype=torch.float32), persistent=False)

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        inner = self.model.model
        seq = input_ids.shape[1]
        start = cache_position[0].item()
        torch._check_is_size(start)
        torch._check(start + seq <= self.max_seq_len)
        hidden = inner.embed_tokens(input_ids)
        cos, sin = inner.rotary_emb(hidden, cache_position.unsqueeze(0))
        for i, layer in enumerate(inner.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attn.q_proj(x).view(1, seq, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(1, seq, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(1, seq, self.kv_heads, self.head_dim)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k_cache, v_cache = getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}")
            torch.ops.llama.update_cache(k.transpose(1, 2), k_cache, start)
            torch.ops.llama.update_cache(v, v_cache, start)
            # Causal from `start`: query j sees cache rows 0..start + j (grouped-query heads
            # are mapped inside the op).
            out = torch.ops.llama.custom_sdpa(q.transpose(1, 2), k_cache, v_cache, start, None, 0.0, True)
            hidden = hidden + attn.o_proj(out.reshape(1, seq, self.heads * self.head_dim))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.model.lm_head(inner.norm(hidden))
