"""Tiny random llamas built with MLX from a config at test time, saved as an MLX model folder.

No torch: the weights are made by mlx-lm's own `llama.Model` (MLX's random initialisation),
saved with `mlx_lm.utils.save_model`, beside the byte-level tokenizer of
`helpers.tiny_models` (256 byte tokens + 3 ChatML specials). A folder loads with
`mlx_lm.load` in well under a second.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers.tiny_models import BOS_ID, EOS_ID, PAD_ID, TIE_HIGH, TIE_LOW, VOCAB_SIZE, save_tokenizer


def tiny_config(**overrides: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
    }
    cfg.update(overrides)
    return cfg


def build_tiny_mlx_llama(folder: Path, *, seed: int = 0, dtype: str = "bfloat16", tie_rows: bool = False) -> Path:
    """A 2-layer llama with random weights as an MLX folder.

    `tie_rows`: lm_head rows TIE_LOW and TIE_HIGH are bit-identical and lead at every
    position (channel 0 of every embedding is large, so the final norm's channel 0 is large
    and positive whatever the context, and both rows weigh it heavily): every position is an
    exact tie between the two, in the logits and in the logprobs.
    """
    import mlx.core as mx
    from mlx_lm.models import llama
    from mlx_lm.utils import save_config, save_model

    folder.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config()
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(cfg))
    if tie_rows:
        emb = model.model.embed_tokens.weight
        emb[:, 0] = 8.0
        head = model.lm_head.weight
        row = head[TIE_LOW]
        row[0] = 4.0
        head[TIE_LOW] = row
        head[TIE_HIGH] = row
        model.model.embed_tokens.weight = emb
        model.lm_head.weight = head
    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    save_model(folder, model)
    save_config(dict(cfg), folder / "config.json")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS_ID, "bos_token_id": BOS_ID}))
    save_tokenizer(folder)
    return folder
