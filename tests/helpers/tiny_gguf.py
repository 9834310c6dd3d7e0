"""A tiny Llama GGUF written at test time with the `gguf` package (no conversion, no download).

Every layer's weights are zero, so the residual stream is the token embedding (all ones),
the final RMSNorm makes it all ones, and the logits are the rows of `output.weight` summed.
Rows TIE_LOW < TIE_HIGH are identical and lead: every position is an exact tie between them,
which is what tells llama.cpp's two greedy paths apart (the host sampler keeps the first
maximum, ggml's CPU argmax op the last). The other rows are small and distinct, so top-k
lists below the tie are ordinary.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# <unk> <s> </s>, the 256 byte tokens llama.cpp's SentencePiece vocabulary needs (it looks
# up "<0x0A>" for the newline), then plain tokens "t00".."t31".
N_BYTES = 256
FIRST_WORD = 3 + N_BYTES
VOCAB = FIRST_WORD + 32
N_EMBD = 64
N_HEAD = 2
N_FF = 128
TIE_LOW = FIRST_WORD + 5
TIE_HIGH = FIRST_WORD + 20
BOS_ID = 1
EOS_ID = 2


def build_tie_gguf(path: Path, *, n_layer: int = 2) -> Path:
    import gguf

    rng = np.random.default_rng(7)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(256)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    words = VOCAB - FIRST_WORD
    tokens = [b"<unk>", b"<s>", b"</s>"]
    tokens += [f"<0x{b:02X}>".encode() for b in range(N_BYTES)]
    tokens += [f"t{i:02d}".encode() for i in range(words)]
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * VOCAB)
    writer.add_token_types(
        [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
        + [gguf.TokenType.BYTE] * N_BYTES
        + [gguf.TokenType.NORMAL] * words
    )
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_add_bos_token(False)

    f32 = np.float32
    writer.add_tensor("token_embd.weight", np.ones((VOCAB, N_EMBD), dtype=f32))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=f32))
    out = (rng.standard_normal((VOCAB, N_EMBD)) * 0.01).astype(f32)
    out[EOS_ID] = -1.0  # never stop early
    out[TIE_LOW] = 0.05
    out[TIE_HIGH] = out[TIE_LOW]
    writer.add_tensor("output.weight", out)
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=f32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", np.zeros((N_EMBD, N_EMBD), dtype=f32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=f32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", np.zeros((N_FF, N_EMBD), dtype=f32))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", np.zeros((N_FF, N_EMBD), dtype=f32))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", np.zeros((N_EMBD, N_FF), dtype=f32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
