"""Speed of `gate compare --format json` against a bare orjson parse of the same files.

Builds a synthetic trace pair (default 1,000 prompts x 128 positions x top-20, about
70 MB) in a temporary folder, then times, in one run:

- baseline: read both files and `orjson.loads` every line (nothing else);
- in-process: the CLI entry point `gate.cli.main.main(["compare", ...])`, output discarded;
- subprocess: `python -m gate compare ... --format json` (adds interpreter start-up and imports).

Each is the best of `--repeat` interleaved runs, wall and CPU time, and is also set against
the parse with the cyclic GC paused (the stricter baseline). The goal: at most 1.5x.

    .venv/bin/python scripts/bench_compare.py [--prompts 1000] [--positions 128] [--top-k 20]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
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
            lps = -np.cumsum(steps, axis=1, dtype=np.float64)
            # A real top-k's probabilities add up to at most 1 (the reader checks it): leave
            # the tail 5% of the mass.
            lse = np.log(np.exp(lps).sum(axis=1, keepdims=True))
            lps = (lps - lse + np.log(0.95)).astype(np.float32)
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


def bare_parse(paths: tuple[Path, ...], *, gc_off: bool = False) -> None:
    """The baseline: read each file and `orjson.loads` every line, keeping nothing.

    With `gc_off` the cyclic collector is paused, as gate's reader pauses it: the fastest
    honest parse, and the stricter baseline."""
    was = gc.isenabled()
    if gc_off:
        gc.disable()
    try:
        for path in paths:
            with open(path, "rb") as fh:
                for line in fh.read().split(b"\n"):
                    if line:
                        orjson.loads(line)
    finally:
        if was:
            gc.enable()


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


def timed(fn: Callable[[], None]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process and its children)."""
    t0, c0 = time.perf_counter(), _cpu()
    fn()
    return time.perf_counter() - t0, _cpu() - c0


def _cpu() -> float:
    own = time.process_time()
    kids = os.times()
    return own + kids.children_user + kids.children_system


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=1000)
    ap.add_argument("--positions", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=None, help="build the traces in this folder and keep them")
    ap.add_argument("--check", action="store_true", help="exit 1 when the in-process ratio is over the goal")
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
        paths = (oracle, candidate)
        runs: dict[str, Callable[[], None]] = {
            "bare orjson parse": lambda: bare_parse(paths),
            "bare orjson parse, GC off": lambda: bare_parse(paths, gc_off=True),
            "gate compare (in-process)": lambda: gate_in_process(oracle, candidate),
            "gate compare (subprocess)": lambda: gate_subprocess(oracle, candidate),
        }
        for fn in runs.values():  # warm the page cache and the imports
            fn()
        best: dict[str, tuple[float, float]] = {}
        for _ in range(args.repeat):  # interleaved, so a busy machine slows every one alike
            for name, fn in runs.items():
                wall, cpu = timed(fn)
                old = best.get(name)
                best[name] = (min(wall, old[0]), min(cpu, old[1])) if old else (wall, cpu)
        base = best["bare orjson parse"]
        strict_base = best["bare orjson parse, GC off"]
        print(
            f"best of {args.repeat}:                      wall      cpu   ratio (wall/cpu) to the bare parse,"
            " and to the GC-off parse"
        )
        for name, (wall, cpu) in best.items():
            print(
                f"  {name:28s} {wall:7.3f} s {cpu:7.3f} s   {wall / base[0]:.2f}x / {cpu / base[1]:.2f}x"
                f"   {wall / strict_base[0]:.2f}x / {cpu / strict_base[1]:.2f}x"
            )
        ratio = best["gate compare (in-process)"][0] / base[0]
        goal = 1.5
        verdict = "meets" if ratio <= goal else "misses"
        print(
            f"gate compare --format json, in-process: {ratio:.2f}x the bare orjson parse, which {verdict} "
            f"the goal of at most {goal}x"
        )
        if args.check and ratio > goal:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
