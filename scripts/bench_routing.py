"""What recording MoE routing costs the HF engine, in one process, interleaved:

1. a dense model (the embedded default unless --dense): `HFEngine.generate` as it is
   (no router, so no hook is installed) against the same engine with its model call
   made directly, bypassing the routing wrapper: the ratio should be 1.00;
2. a tiny Qwen3-MoE built from a config: routing recorded (router hooks) against
   `record_routing=false` (no hooks): the price of recording.

Figures: the median over repeats of the time per generated token, summed over prompts.

    python scripts/bench_routing.py [--dense ID] [--prompts 4] [--max-tokens 32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

TEXTS = ("import numpy as np", "The capital of France is", "def fibonacci(n):", "Once upon a time,")


def per_token(engine: Any, prompts: list[Any]) -> float:
    start = time.perf_counter()
    records = engine.generate(prompts, 20)
    return (time.perf_counter() - start) / max(1, sum(len(r.token_ids) for r in records))


def compare(label: str, a: Any, b: Any, prompts: list[Any], repeats: int) -> None:
    ta, tb = [], []
    per_token(a, prompts), per_token(b, prompts)  # warm up
    for _ in range(repeats):
        ta.append(per_token(a, prompts))
        tb.append(per_token(b, prompts))
    ma, mb = statistics.median(ta), statistics.median(tb)
    print(f"{label}: {1e3 * ma:.2f} ms/token vs {1e3 * mb:.2f} ms/token, ratio {ma / mb:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dense", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", default="1")
    args = parser.parse_args()

    from helpers.tiny_models import build_tiny_qwen3_moe

    from gate.core.engine import PromptInput
    from gate.engines.hf.engine import HFEngine

    def inputs(engine: Any) -> list[Any]:
        return [PromptInput(f"p{i}", engine.encode(t), args.max_tokens) for i, t in enumerate(TEXTS[: args.prompts])]

    dense = HFEngine(args.dense, threads=args.threads)
    bare = HFEngine(args.dense, threads=args.threads)
    bare._forward = lambda ids, **kw: bare.model(**kw)  # type: ignore[method-assign]
    assert dense.router_hooks is None
    assert not any(m._forward_hooks for m in dense.model.modules())
    compare(f"dense {args.dense}: as is / direct model call", dense, bare, inputs(dense), args.repeats)

    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_tiny_qwen3_moe(Path(tmp) / "moe"))
        hooked = HFEngine(path, threads=args.threads)
        plain = HFEngine(path, threads=args.threads, record_routing="false")
        assert hooked.router_hooks is not None and plain.router_hooks is None
        compare("tiny Qwen3-MoE: routing recorded / not", hooked, plain, inputs(hooked), args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
