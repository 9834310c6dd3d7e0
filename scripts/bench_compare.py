"""Speed of `gate compare --format json` against a bare orjson parse of the same files.

Builds a synthetic trace pair (default 1,000 prompts x 128 positions x top-20, about
70 MB) in a temporary folder, then times, in one run:

- baseline: read both files and `orjson.loads` every line (nothing else);
- in-process: the CLI entry point `gate.cli.main.main(["compare", ...])`, output discarded;
- subprocess: `python -m gate compare ... --format json` (adds interpreter start-up and imports).

Each is the best of `--repeat` interleaved runs, wall and CPU time, and is also set against
the parse with the cyclic GC paused (the stricter baseline). The goal: at most 1.5x.

With `--reference` the candidate also reports its own top-k lists (free run and forced), and
the oracle is written twice: as a pin with a floor (the distribution verdict measured against
the oracle's lists), and as a pin that also carries float32 reference lists at every position
and a `reference_floor` (the same positions measured against both); both are timed, each
against the bare parse of its own files, and with the reference against without.

    .venv/bin/python scripts/bench_compare.py [--prompts 1000] [--positions 128] [--top-k 20] [--reference]
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

FLOOR = {"kl_mean_mnats": 1e6, "kl_p99_mnats": 1e6, "same_top_rate": 0.0, "margin": 1.5, "measured_by": "bench"}
DOCTRINE = {"floor": FLOOR}
DOCTRINE_REF = {"floor": FLOOR, "reference_floor": FLOOR}


def own_list(rng: np.random.Generator, ids: np.ndarray, lps: np.ndarray, token: int) -> list[list[object]]:
    """A candidate's own top-k at one position: the oracle's list jittered, its token on top."""
    lp = lps.astype(np.float64) + rng.normal(0.0, 0.01, size=lps.shape)
    got = [int(t) for t in ids]
    if token not in got:
        got[-1] = token
    lp[got.index(token)] = lp.max() + 1e-3
    lp = lp - np.log(np.exp(lp).sum()) + np.log(0.95)
    pairs = sorted(zip(got, lp.astype(np.float32).tolist(), strict=True), key=lambda p: (-p[1], p[0]))
    return [[t, float(v)] for t, v in pairs]


def build_pair(
    folder: Path, prompts: int, positions: int, top_k: int, seed: int = 0, reference: bool = False
) -> tuple[Path, Path]:
    """Write an oracle and a candidate trace. Most prompts match; a few diverge by an exact
    tie, a near tie or a defect, and every tenth candidate record carries forced data. With
    `reference` the candidate reports its own lists and the oracle is written twice: under a
    floor (`oracle.jsonl`) and also with float32 reference lists (`oracle-ref.jsonl`)."""
    rng = np.random.default_rng(seed)
    oracle_path, candidate_path = folder / "oracle.jsonl", folder / "candidate.jsonl"
    head = {"gate_trace": 1, "model": "bench/model", "engine": {"name": "bench", "version": "1"}}
    ref_out = open(folder / "oracle-ref.jsonl", "wb") if reference else None  # noqa: SIM115 (closed below)
    with open(oracle_path, "wb") as fo, open(candidate_path, "wb") as fc:
        extra = {"doctrine": DOCTRINE} if reference else {}
        fo.write(orjson.dumps({**head, "role": "oracle", "top_k": top_k, **extra}) + b"\n")
        if ref_out is not None:
            ref_head = {**head, "role": "oracle", "top_k": top_k, "doctrine": DOCTRINE_REF}
            ref_out.write(orjson.dumps({**ref_head, "reference": {"dtype": "float32"}}) + b"\n")
        fc.write(orjson.dumps({**head, "role": "candidate", "top_k": top_k if reference else 0}) + b"\n")
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
            orec = {
                "id": pid,
                "prompt_token_ids": prompt_ids,
                "token_ids": oracle_tokens,
                "top_logprobs": top,
                "finish_reason": "length",
            }
            fo.write(orjson.dumps(orec) + b"\n")
            rec: dict[str, object] = {"id": pid, "prompt_token_ids": prompt_ids, "token_ids": cand}
            forced: list[int] | None = None
            if p % 10 == 0 or (reference and cand != oracle_tokens):
                forced = list(oracle_tokens)
                if p % 10 == 0:
                    forced[60] = int(ids[60, 1])
                rec["forced_token_ids"] = forced
            if ref_out is not None:
                rec["top_logprobs"] = [own_list(rng, ids[i], lps[i], t) for i, t in enumerate(cand)]
                if forced is not None:
                    rec["forced_top_logprobs"] = [own_list(rng, ids[i], lps[i], t) for i, t in enumerate(forced)]
                refs = [own_list(rng, ids[i], lps[i], t) for i, t in enumerate(oracle_tokens)]
                ref_out.write(orjson.dumps({**orec, "reference_top_logprobs": refs}) + b"\n")
            fc.write(orjson.dumps(rec) + b"\n")
    if ref_out is not None:
        ref_out.close()
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
    ap.add_argument(
        "--reference", action="store_true", help="candidate lists, and the oracle with and without a float32 reference"
    )
    args = ap.parse_args()
    if args.reference:
        return bench_reference(args)

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


def bench_reference(args: argparse.Namespace) -> int:
    """`gate compare` with the candidate's lists, against a pin with a floor and against the
    same pin carrying float32 reference lists and a `reference_floor`."""
    with tempfile.TemporaryDirectory(prefix="gate-bench-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        oracle, candidate = build_pair(folder, args.prompts, args.positions, args.top_k, reference=True)
        with_ref = folder / "oracle-ref.jsonl"
        mb = {p.name: os.path.getsize(p) / 1e6 for p in (oracle, with_ref, candidate)}
        print(f"traces: {args.prompts} prompts x {args.positions} positions x top-{args.top_k}; MB: {mb}")
        runs: dict[str, Callable[[], None]] = {
            "bare parse, floor pin": lambda: bare_parse((oracle, candidate)),
            "bare parse, reference pin": lambda: bare_parse((with_ref, candidate)),
            "gate compare, floor pin": lambda: gate_in_process(oracle, candidate),
            "gate compare, reference pin": lambda: gate_in_process(with_ref, candidate),
        }
        for fn in runs.values():
            fn()
        best: dict[str, tuple[float, float]] = {}
        for _ in range(args.repeat):
            for name, fn in runs.items():
                wall, cpu = timed(fn)
                old = best.get(name)
                best[name] = (min(wall, old[0]), min(cpu, old[1])) if old else (wall, cpu)
        for name, (wall, cpu) in best.items():
            print(f"  {name:28s} {wall:7.3f} s wall {cpu:7.3f} s cpu")
        no_ref = best["gate compare, floor pin"][0] / best["bare parse, floor pin"][0]
        ref = best["gate compare, reference pin"][0] / best["bare parse, reference pin"][0]
        slower = best["gate compare, reference pin"][0] / best["gate compare, floor pin"][0]
        print(
            f"gate compare, in-process, best of {args.repeat}: {no_ref:.2f}x its bare parse without the reference, "
            f"{ref:.2f}x with it; with the reference {slower:.2f}x the time without"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
