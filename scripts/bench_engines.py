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
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from gate.core.engine import PromptInput
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

    def timed(fn: Callable[[], int]) -> tuple[float, float, int]:
        """(wall seconds, this process's CPU seconds, tokens)."""
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        n = fn()
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, time.process_time() - c0, n

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
    names = ("gate generate", "transformers generate", "gate force")
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.repeats):
        totals: dict[str, list[float]] = {name: [0.0, 0.0, 0.0] for name in names}
        for p in prompts:
            for name, fn in zip(names, (ours, transformers_generate, forced), strict=True):
                seconds, cpu_seconds, n = timed(lambda fn=fn, p=p: fn(p))  # type: ignore[misc]
                totals[name][0] += seconds
                totals[name][1] += cpu_seconds
                totals[name][2] += n
        for name, (total_s, total_cpu_s, tokens) in totals.items():
            wall[name].append(total_s / max(tokens, 1.0))
            cpu[name].append(total_cpu_s / max(tokens, 1.0))

    med = {name: statistics.median(v) for name, v in wall.items()}
    med_cpu = {name: statistics.median(v) for name, v in cpu.items()}
    print(
        f"model {model} on {engine.device} ({args.dtype}), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; load {load_s:.1f} s"
    )
    print(
        f"{len(prompts)} prompts x up to {args.max_tokens} tokens, top_k {args.top_k}, "
        f"median of {args.repeats} interleaved repeats"
    )
    for name, value in med.items():
        spread = ", ".join(f"{1000 * v:.2f}" for v in wall[name])
        print(f"  {name:<22} {1000 * value:8.2f} ms/token wall, {1000 * med_cpu[name]:8.2f} CPU  (runs: {spread})")
    for label, figures in (("wall", med), ("CPU ", med_cpu)):
        gen_ratio = figures["gate generate"] / figures["transformers generate"]
        force_ratio = figures["gate force"] / figures["gate generate"]
        print(
            f"{label}: gate generate / transformers generate = {gen_ratio:.3f} (goal <= 1.0); "
            f"gate force / gate generate = {force_ratio:.3f} (goal <= 1.1)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
