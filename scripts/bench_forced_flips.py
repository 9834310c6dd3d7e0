"""How `compare` scales with the number of forced flips (every forced divergence once
re-validated the record's whole forced list, quadratic time).

    python scripts/bench_forced_flips.py [--pairs 500] [--flips 400]

Builds, in memory, one prompt with N and then 2N forced flips, each position carrying a
top-k list of `--pairs` pairs on both sides, times `compare` on each in this process, and
prints the ratio: about 2 is linear, about 4 quadratic. Pure Python, no engine.
"""

from __future__ import annotations

import argparse
import time

from gate.core.traces.trace import PromptRecord, Trace, TraceHeader
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.doctrine import Doctrine, Evidence


def traces(n: int, k: int) -> tuple[Trace, Trace]:
    tops = [[[t, -2.5 - 0.05 * j] for j, t in enumerate(range(1000, 1000 + k))] for _ in range(n)]
    mine = [[[1001, -2.5], [1000, -2.55]] + [[t, -2.5 - 0.05 * j] for j, t in enumerate(range(1002, 1000 + k), 2)]]
    o = PromptRecord("p", (1, 2), (1000,) * n, tops, token_logits=[20.0] * n)
    c = PromptRecord("p", (1, 2), (1001,) * n, forced_token_ids=(1001,) * n, forced_top_logprobs=mine * n)
    head = {"model": "m", "top_k": k, "engine": {"name": "bench", "version": "1"}}
    return (
        Trace(TraceHeader(role="oracle", **head), (o,)),  # type: ignore[arg-type]
        Trace(TraceHeader(role="candidate", **head), (c,)),  # type: ignore[arg-type]
    )


def timed(n: int, k: int, doctrine: Doctrine) -> float:
    o, c = traces(n, k)
    start = time.perf_counter()
    result = compare(o, c, doctrine)
    took = time.perf_counter() - start
    assert result.counts["near_ties"] == n, result.summary
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=500)
    ap.add_argument("--flips", type=int, default=400)
    args = ap.parse_args()
    doctrine = Doctrine(near_tie_ulps=2.0, evidence=Evidence(4.0, 2.0, 2.0))
    one = timed(args.flips, args.pairs, doctrine)
    two = timed(2 * args.flips, args.pairs, doctrine)
    print(
        f"{args.flips} forced flips x {args.pairs} pairs: {one:.2f} s; {2 * args.flips}: {two:.2f} s; "
        f"ratio {two / one:.2f} (2 linear, 4 quadratic)"
    )


if __name__ == "__main__":
    main()
