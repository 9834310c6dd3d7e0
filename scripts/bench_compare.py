"""Speed of `gate compare --format json` against a bare orjson parse of the same files.

Builds a synthetic trace pair (default 1,000 prompts x 128 positions x top-20, about
70 MB) in a temporary folder, then times, in one run:

- baseline: read both files and `orjson.loads` every line (nothing else);
- in-process: the CLI entry point `gate.cli.main.main(["compare", ...])`, output discarded;
- subprocess: `python -m gate compare ... --format json` (adds interpreter start-up and imports).

Each is the best of `--repeat` runs. Prints the ratios; the goal is at most 1.5x in-process.

    .venv/bin/python scripts/bench_compare.py [--prompts 1000] [--positions 128] [--top-k 20]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson


def build_pair(folder: Path, prompts: int, positions: int, top_k: int, seed: int = 0) -> tuple[Path, Path]:
    """Write an oracle and a candidate trace. Most prompts match; a few diverge by an exact
    tie, a near tie or a defect, and every tenth candidate record carries forced data."""
    rng = np.random.default_rng(seed)
    oracle_path, candidate_path = folder / "oracle.jsonl", folder / "candidate.jsonl"
    head = {"gate_trace": 1, "model": "bench/model", "engine": {"name": "bench", "version": "1"}}
    with open(oracle_path, "wb") as fo, open(candidate_path, "wb") as fc:
        fo.write(orjson.dumps({**head, "role": "oracle", "top_k": top_k}) + b"\n")
        fc.write(orjson.dumps({**head, "role": "candidate", "top_k": 0}) + b"\n")
        for p in range(prompts):
            # logprobs: float32 values, strictly descending within each position.
            steps = rng.exponential(0.4, size=(positions, top_k)).astype(np.float32) + np.float32(1e-3)
            lps = -np.cumsum(steps, axis=1, dtype=np.float32)
            ids = np.stack([rng.choice(50_000, size=top_k, replace=False) for _ in range(positions)])
            kind = p % 50
            if kind == 1:  # an exact tie at position 5: the oracle holds the lower id first
                lps[5, 1] = lps[5, 0]
                ids[5, :2] = np.sort(ids[5, :2])
            top = [
                [[int(t), float(lp)] for t, lp in zip(ids[i].tolist(), lps[i].tolist(), strict=True)]
                for i in range(positions)
            ]
            oracle_tokens = ids[:, 0].tolist()
            cand = list(oracle_tokens)
            if kind == 1:
                cand[5] = int(ids[5, 1])  # took the higher id of the tie
            elif kind == 2:
                cand[40] = int(ids[40, 1])  # near tie or defect, depending on the gap
            elif kind == 3:
                cand = cand[:100]  # stopped early
            elif kind == 4:
                cand[7] = 50_001  # outside the oracle's top-k
            pid = f"bench-{p:05d}"
            prompt_ids = rng.integers(0, 50_000, size=24).tolist()
            fo.write(
                orjson.dumps(
                    {
                        "id": pid,
                        "prompt_token_ids": prompt_ids,
                        "token_ids": oracle_tokens,
                        "top_logprobs": top,
                        "finish_reason": "length",
                    }
                )
                + b"\n"
            )
            rec: dict[str, object] = {"id": pid, "prompt_token_ids": prompt_ids, "token_ids": cand}
            if p % 10 == 0:
                forced = list(oracle_tokens)
                forced[60] = int(ids[60, 1])
                rec["forced_token_ids"] = forced
            fc.write(orjson.dumps(rec) + b"\n")
    return oracle_path, candidate_path


def bare_parse(paths: tuple[Path, ...]) -> None:
    for path in paths:
        with open(path, "rb") as fh:
            for line in fh.read().split(b"\n"):
                if line:
                    orjson.loads(line)


def gate_in_process(oracle: Path, candidate: Path) -> None:
    from gate.cli.main import main

    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(["compare", str(oracle), str(candidate), "--format", "json"])
        except SystemExit as exc:
            if exc.code not in (0, 1):
                raise RuntimeError(f"gate compare exited {exc.code}") from None
    if '"gate_report": 1' not in sink.getvalue():
        raise RuntimeError("gate compare wrote no JSON report")


def gate_subprocess(oracle: Path, candidate: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gate", "compare", str(oracle), str(candidate), "--format", "json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"gate compare exited {proc.returncode}: {proc.stderr.decode()}")


def best_of(repeat: int, fn: Callable[[], None]) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=1000)
    ap.add_argument("--positions", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=None, help="build the traces in this folder and keep them")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="gate-bench-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        oracle, candidate = build_pair(folder, args.prompts, args.positions, args.top_k)
        size = (os.path.getsize(oracle) + os.path.getsize(candidate)) / 1e6
        print(
            f"traces: {args.prompts} prompts x {args.positions} positions x top-{args.top_k}, "
            f"{size:.1f} MB (built in {time.perf_counter() - t0:.1f} s)"
        )
        bare_parse((oracle, candidate))  # warm the page cache
        gate_in_process(oracle, candidate)  # warm imports
        base = best_of(args.repeat, lambda: bare_parse((oracle, candidate)))
        inproc = best_of(args.repeat, lambda: gate_in_process(oracle, candidate))
        sub = best_of(args.repeat, lambda: gate_subprocess(oracle, candidate))
        print(f"bare orjson parse:          {base:7.3f} s")
        print(f"gate compare (in-process):  {inproc:7.3f} s   ratio {inproc / base:.2f}x")
        print(f"gate compare (subprocess):  {sub:7.3f} s   ratio {sub / base:.2f}x")
        goal = 1.5
        verdict = "meets" if inproc / base <= goal else "misses"
        print(f"in-process ratio {inproc / base:.2f}x {verdict} the goal of at most {goal}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
