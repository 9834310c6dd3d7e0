"""Time the HF engine's MoE routing record and replay at Qwen3.6's routing scale: a tiny-width
Qwen3.5-MoE with 256 experts, 8 per token, plus the shared expert (tests/helpers/tiny_models.py).

    OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/bench_moe_routing_scale.py [FOLDER]

Prints the seconds of 4 prompts x 16 tokens with routing off, recorded, replayed from that
record, and replayed with every expert id moved by one, and whether each replay changed tokens.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main(folder: Path) -> None:
    import torch
    from helpers.tiny_models import build_tiny_qwen3_5_moe

    from gate.core.engine import PromptInput
    from gate.engines.hf.engine import HFEngine

    torch.set_num_threads(1)
    path = build_tiny_qwen3_5_moe(folder, seed=6, lm_head_scale=20.0, experts=(256, 8))
    prompts = [
        PromptInput(id=f"p{i}", prompt_token_ids=tuple((11 * i + 5 * j) % 250 for j in range(40)), max_tokens=16)
        for i in range(4)
    ]

    def timed(engine: Any, label: str) -> list[Any]:
        engine.generate(prompts[:1], 5)  # warm
        start = time.perf_counter()
        records = engine.generate(prompts, 5)
        print(f"{label}: {time.perf_counter() - start:.2f} s", flush=True)
        return records

    timed(HFEngine(str(path), record_routing=False, tokenizer=False), "routing not recorded")
    own = timed(HFEngine(str(path), tokenizer=False), "routing recorded")
    recorded = {tuple(r.prompt_token_ids): r.routed_experts for r in own}
    moved = {k: [[[(e + 1) % 256 for e in layer] for layer in t] for t in v] for k, v in recorded.items()}
    for label, rows in (("replayed", recorded), ("replayed, experts moved by one id", moved)):
        engine = HFEngine(str(path), routing="oracle", tokenizer=False)
        engine.replay_routing(rows)
        again = timed(engine, f"routing {label}")
        changed = sum(a.token_ids != b.token_ids for a, b in zip(again, own, strict=True))
        print(f"  tokens changed in {changed} of {len(own)} prompts", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/gate-moe-256"))
