"""Benchmark the HF engine's decode loop, in one run:

1. `HFEngine.generate` (top-k logprobs on) against transformers' `model.generate(do_sample=
   False)` on the same model and prompts, time per generated token (goal: no slower);
2. `HFEngine.force` on the engine's own tokens against `HFEngine.generate`, per token
   (goal: at most 1.1x).

Runs are interleaved prompt by prompt (generate, transformers, force, ...) and repeated,
so a machine shared with other jobs slows all three alike; the figures are the median
over repeats of the per-token time summed over all prompts.

    python scripts/bench_engines.py [--model ID] [--prompts 8] [--max-tokens 32] [--top-k 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

TEXTS = (
    "import numpy as np",
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
    "Here is a list of fruits:\n-",
    "The quick brown fox",
    "SELECT name FROM users WHERE",
    "In 1969, the first humans",
    "Water boils at",
    "for i in range(10):",
    "The three primary colours are",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model id or folder (default: the embedded default)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()

    import torch

    from gate.engines.base import PromptInput
    from gate.engines.hf import HFEngine
    from gate.models.default import DEFAULT_MODEL

    model = args.model or DEFAULT_MODEL
    started = time.perf_counter()
    engine = HFEngine(model, device=args.device, dtype=args.dtype)
    load_s = time.perf_counter() - started
    texts = [TEXTS[i % len(TEXTS)] for i in range(args.prompts)]
    prompts = []
    for i, text in enumerate(texts):
        ids = engine.encode(text)
        assert ids is not None, "the benchmark needs a model with a tokenizer"
        prompts.append(PromptInput(f"p{i}", ids, args.max_tokens))
    hf_model = engine.model
    eos = sorted(engine.stop_ids) or None

    def timed(fn: Callable[[], int]) -> tuple[float, int]:
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        n = fn()
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, n

    def ours(p: PromptInput) -> int:
        return len(engine.generate([p], args.top_k)[0].token_ids)

    def transformers_generate(p: PromptInput) -> int:
        ids = torch.tensor([list(p.prompt_token_ids)], device=engine.device)
        with torch.inference_mode():
            out = hf_model.generate(
                ids, max_new_tokens=p.max_tokens, do_sample=False, eos_token_id=eos, pad_token_id=(eos or [0])[0]
            )
        return int(out.shape[1] - ids.shape[1])

    own_tokens = {p.id: engine.generate([p], 0)[0].token_ids for p in prompts}  # also the warm-up

    def forced(p: PromptInput) -> int:
        return len(engine.force(p.prompt_token_ids, own_tokens[p.id], args.top_k).token_ids)

    transformers_generate(prompts[0])  # warm-up of generate's own setup
    per_token: dict[str, list[float]] = {"gate generate": [], "transformers generate": [], "gate force": []}
    for _ in range(args.repeats):
        totals = {name: [0.0, 0] for name in per_token}
        for p in prompts:
            for name, fn in (
                ("gate generate", ours),
                ("transformers generate", transformers_generate),
                ("gate force", forced),
            ):
                seconds, n = timed(lambda fn=fn, p=p: fn(p))  # type: ignore[misc]
                totals[name][0] += seconds
                totals[name][1] += n
        for name, (seconds, n) in totals.items():
            per_token[name].append(seconds / max(int(n), 1))

    med = {name: statistics.median(v) for name, v in per_token.items()}
    print(
        f"model {model} on {engine.device} ({args.dtype}), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; load {load_s:.1f} s"
    )
    print(
        f"{len(prompts)} prompts x up to {args.max_tokens} tokens, top_k {args.top_k}, "
        f"median of {args.repeats} interleaved repeats"
    )
    for name, value in med.items():
        spread = ", ".join(f"{1000 * v:.2f}" for v in per_token[name])
        print(f"  {name:<22} {1000 * value:8.2f} ms/token   (runs: {spread})")
    gen_ratio = med["gate generate"] / med["transformers generate"]
    force_ratio = med["gate force"] / med["gate generate"]
    print(f"gate generate / transformers generate = {gen_ratio:.3f}  (goal <= 1.0)")
    print(f"gate force / gate generate            = {force_ratio:.3f}  (goal <= 1.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
