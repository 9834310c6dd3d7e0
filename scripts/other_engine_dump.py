"""Play "another engine": dump a model's activations over the context `gate diagnose
--emit-context` wrote, in the format of docs/reference/activation-dump.md, without gate.

    python scripts/other_engine_dump.py CONTEXT.json MODEL_DIR OUT.safetensors \\
        [--dtype bfloat16] [--store bf16|f32] [--scale-mlp LAYER:FACTOR] [--path prefill|decode]

Plain transformers and safetensors: the model in `--dtype`, one forward hook per module the
context file names (the output's first tensor; a decoder layer's output is the residual stream
after it), the whole context in one forward (`--path prefill`, the default) or the prompt then
one token at a time through the KV cache (`--path decode`), and the tensors written with the
context's hash in the file's metadata. `--scale-mlp 9:1.5` plants a bug: layer 9's MLP output
multiplied by 1.5, as an engine's wrong scale would.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM


def first_tensor(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return next(x for x in output if isinstance(x, torch.Tensor))
    return output.logits


def dump(
    context_file: Path,
    model_dir: Path,
    out: Path,
    *,
    dtype: str = "bfloat16",
    store: str = "bf16",
    scale_mlp: str | None = None,
    path: str = "prefill",
) -> None:
    context = json.loads(context_file.read_text())
    ids: list[int] = context["context_token_ids"]
    prompt_length = len(context["prompt_token_ids"])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    if scale_mlp:  # the planted bug, registered first so the dump hooks see its output
        layer, factor = scale_mlp.split(":")
        model.get_submodule(f"model.layers.{int(layer)}.mlp").register_forward_hook(lambda m, a, o: o * float(factor))
    rows: dict[str, list[torch.Tensor]] = {m["name"]: [] for m in context["modules"]}

    def hook(name: str) -> Any:
        def keep(module: Any, args: Any, output: Any) -> None:
            t = first_tensor(output).detach()
            rows[name].append(t.reshape(-1, t.shape[-1]).float().clone())

        return keep

    for name in rows:
        model.get_submodule(name).register_forward_hook(hook(name))
    with torch.inference_mode():
        if path == "prefill":
            model(input_ids=torch.tensor([ids]), logits_to_keep=0)
        else:
            out_ = model(input_ids=torch.tensor([ids[:prompt_length]]), use_cache=True, logits_to_keep=0)
            cache = out_.past_key_values
            for token in ids[prompt_length:]:
                out_ = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
                cache = out_.past_key_values
    stored = torch.bfloat16 if store == "bf16" else torch.float32
    tensors = {name: torch.cat(parts).to(stored) for name, parts in rows.items()}
    meta = {
        "context_sha256": context["context_sha256"],
        "prompt_id": context["prompt_id"],
        "position": str(context["position"]),
        "path": path,
        "engine": "other-engine (plain transformers)" + (f", mlp of layer {scale_mlp} scaled" if scale_mlp else ""),
        "dtype": dtype,
    }
    save_file(tensors, str(out), metadata=meta)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("context", type=Path)
    parser.add_argument("model", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--store", choices=("bf16", "f32"), default="bf16")
    parser.add_argument("--scale-mlp", default=None, metavar="LAYER:FACTOR")
    parser.add_argument("--path", choices=("prefill", "decode"), default="prefill")
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = {"dtype": args.dtype, "store": args.store, "scale_mlp": args.scale_mlp, "path": args.path}
    dump(args.context, args.model, args.out, **options)


if __name__ == "__main__":
    main()
