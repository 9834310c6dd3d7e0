"""Time gate's ExecuTorch engine on the default model with its two attentions, in one run.

Two `ExecuTorchEngine`s on the same prompts (the default pin's first `--prompts`, their
pinned token budgets), `attention=masked` (index_put into the cache, SDPA over every cache
row with a causal mask row) and `attention=custom_sdpa` (ExecuTorch's `llama.update_cache`
and `llama.custom_sdpa`), `--threads` runtime threads each. Their `generate` calls (top-k
lists on) are interleaved prompt by prompt and repeated, so a machine shared with other jobs
slows both alike; the figures are the median over repeats of the per-token time summed over
all prompts, and the ratio custom_sdpa / masked. Whether both chose the same tokens is
printed too. Each program is exported into gate's cache on first use (minutes).

    OMP_NUM_THREADS=1 python scripts/bench_executorch_attention.py [--prompts 4] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top-k", type=int, default=20)
    args = parser.parse_args()

    from gate.core.pins.pin import load_pin
    from gate.engines.executorch.engine import ExecuTorchEngine
    from gate.models.default import DEFAULT_MODEL
    from gate.workflows.run.core import prompt_inputs

    prompts = prompt_inputs(load_pin(DEFAULT_MODEL, None))[: args.prompts]
    names = ("masked", "custom_sdpa")
    engines = {a: ExecuTorchEngine(DEFAULT_MODEL, threads=args.threads, attention=a) for a in names}
    per_token: dict[str, list[float]] = {a: [] for a in names}
    chosen: dict[str, dict[str, tuple[int, ...]]] = {a: {} for a in names}
    for _ in range(args.repeats):
        spent = dict.fromkeys(names, 0.0)
        made = dict.fromkeys(names, 0)
        for prompt in prompts:
            for name, engine in engines.items():
                started = time.perf_counter()
                record = engine.generate([prompt], args.top_k)[0]
                spent[name] += time.perf_counter() - started
                made[name] += len(record.token_ids)
                chosen[name][prompt.id] = record.token_ids
        for name in names:
            per_token[name].append(1000 * spent[name] / max(1, made[name]))
    median = {a: statistics.median(v) for a, v in per_token.items()}
    for name in names:
        shown = ", ".join(f"{x:.1f}" for x in per_token[name])
        print(f"{name}: {median[name]:.1f} ms/token (repeats: {shown})")
    print(f"custom_sdpa / masked: {median['custom_sdpa'] / median['masked']:.3f}")
    print(f"same tokens: {chosen['masked'] == chosen['custom_sdpa']}")
    for engine in engines.values():
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
