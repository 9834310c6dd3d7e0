#!/usr/bin/env python
"""Fuzz the trace reader at scale: every input must give a Trace or a TraceError.

    .venv/bin/python scripts/fuzz_trace.py --seconds 180            # atheris if installed
    .venv/bin/python scripts/fuzz_trace.py --seconds 180 --engine random

Engines:
- `atheris` (pip install atheris): coverage-guided libFuzzer over gate's own bytecode,
  seeded with valid traces, with a mutator that mixes libFuzzer's byte mutations with
  structural ones (values swapped for values of other types, keys dropped, lines and
  list elements reordered or duplicated).
- `random`: the same seeds and mutations driven by a seeded `random.Random`; no extra
  dependency, reproducible with `--seed`.

A Trace the reader accepts must also survive a write and a second read unchanged. Any
other exception is a crash: the input is saved as `crash-<sha1>.jsonl` in the current
folder and the script exits 1. At the end it prints how many inputs were tried.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import orjson

# --------------------------------------------------------------------------- valid seeds

_TIES = (0.0, -0.0, -0.125, -0.5, -1.0, -30.0)
_BIG_IDS = (2**53 - 1, 2**53, 2**53 + 1, 2**64 - 1)


def _token(rnd: random.Random) -> int:
    return rnd.choice(_BIG_IDS) if rnd.random() < 0.02 else rnd.randrange(0, 200)


def _text(rnd: random.Random) -> str:
    return "".join(rnd.choice('ab é\u00e9\u4e2d\U0001f600"\\\n\t{}[]') for _ in range(rnd.randrange(0, 8)))


def valid_trace(rnd: random.Random) -> list[dict[str, Any]]:
    role = rnd.choice(("oracle", "candidate"))
    top_k = rnd.randrange(1 if role == "oracle" else 0, 6)
    header: dict[str, Any] = {
        "gate_trace": 1,
        "role": role,
        "model": "org/tiny",
        "top_k": top_k,
        "engine": {"name": "vllm", "version": "0.11.0", "options": {"dtype": "bfloat16"}},
    }
    if rnd.random() < 0.5:
        header["created_at"] = "2025-01-01T00:00:00Z"
    lines: list[dict[str, Any]] = [header]
    for i in range(rnd.randrange(0, 6)):
        n = rnd.randrange(0, 6)
        rec: dict[str, Any] = {"id": f"p{i}{_text(rnd)}", "prompt_token_ids": [_token(rnd) for _ in range(4)]}
        if role == "oracle" or (top_k and rnd.random() < 0.5):
            tops = []
            for _ in range(n):
                ids = rnd.sample(range(0, 200), top_k)
                lps = [rnd.choice(_TIES) if rnd.random() < 0.4 else -rnd.random() * 20 for _ in ids]
                tops.append([[t, lp] for t, lp in sorted(zip(ids, lps, strict=True), key=lambda p: (-p[1], p[0]))])
            rec["top_logprobs"] = tops
            rec["token_ids"] = [t[0][0] for t in tops]  # greedy: lowest id among equal maxima
        else:
            rec["token_ids"] = [_token(rnd) for _ in range(n)]
        if rnd.random() < 0.5:
            rec["finish_reason"] = rnd.choice(("length", "stop"))
        if rnd.random() < 0.3:
            rec["prompt"] = _text(rnd)
        if rnd.random() < 0.3:
            rec["tokens"] = [_text(rnd) for _ in range(n)]
        if role == "candidate" and rnd.random() < 0.3:
            rec["forced_token_ids"] = [_token(rnd) for _ in range(n)]
        lines.append(rec)
    return lines


def encode(lines: list[Any]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


# --------------------------------------------------------------------------- mutations

WEIRD: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    *_BIG_IDS,
    -(2**63),
    0.5,
    -0.0,
    1.0,
    -1e-300,
    1e308,
    -1e308,
    5e-324,
    "",
    "x",
    "NaN",
    "oracle",
    "candidate",
    "\u0000",
    [],
    [[]],
    [[[]]],
    [0],
    [-1],
    [[1, -0.5]],
    [[[1, -0.5]]],
    [[[1, 0.5]]],
    [[[1, -0.5, 2]]],
    [1, [2]],
    {},
    {"name": "x"},
    {"name": "x", "version": "1"},
]


def _containers(obj: Any, out: list[Any]) -> list[Any]:
    if isinstance(obj, dict | list):
        out.append(obj)
        for child in obj.values() if isinstance(obj, dict) else obj:
            _containers(child, out)
    return out


def mutate_structure(lines: list[Any], rnd: random.Random) -> list[Any]:
    lines = copy.deepcopy(lines)
    op = rnd.choice(("swap_type", "drop_key", "reorder_list", "swap_lines", "dup_line", "tweak_number"))
    if op in ("swap_lines", "dup_line") and lines:
        i, j = rnd.randrange(len(lines)), rnd.randrange(len(lines))
        if op == "swap_lines":
            lines[i], lines[j] = lines[j], lines[i]
        else:
            lines.insert(j, copy.deepcopy(lines[i]))
        return lines
    spot = rnd.choice(_containers(lines, []))
    keys = list(spot) if isinstance(spot, dict) else list(range(len(spot)))
    if not keys:
        return lines
    key = rnd.choice(keys)
    if op == "swap_type":
        spot[key] = copy.deepcopy(rnd.choice(WEIRD))
    elif op == "drop_key":
        del spot[key]
    elif op == "reorder_list" and isinstance(spot, list):
        j = rnd.randrange(len(spot))
        spot[key], spot[j] = spot[j], spot[key]
    elif op == "tweak_number" and isinstance(spot[key], int | float) and not isinstance(spot[key], bool):
        v = spot[key]
        spot[key] = rnd.choice((-v, v + 1, v - 1, v * 2, v / 3 if v else 1.5))
    return lines


def mutate_bytes(data: bytes, rnd: random.Random) -> bytes:
    if not data:
        return rnd.randbytes(rnd.randrange(0, 16))
    i = rnd.randrange(len(data))
    op = rnd.choice(("flip", "truncate", "insert", "delete", "newline"))
    if op == "flip":
        return data[:i] + bytes([data[i] ^ rnd.randrange(1, 256)]) + data[i + 1 :]
    if op == "truncate":
        return data[:i]
    if op == "insert":
        return data[:i] + rnd.randbytes(rnd.randrange(1, 9)) + data[i:]
    if op == "delete":
        return data[:i] + data[i + rnd.randrange(1, 17) :]
    return data[:i] + b"\n" + data[i:] if rnd.random() < 0.5 else data.replace(b"\n", b" ", 1)


def parse_lines(data: bytes) -> list[Any] | None:
    try:
        return [orjson.loads(line) for line in data.split(b"\n") if line.strip()]
    except orjson.JSONDecodeError:
        return None


def mutate(data: bytes, rnd: random.Random) -> bytes:
    """Structural changes when the input still parses, then byte changes."""
    lines = parse_lines(data)
    if lines and rnd.random() < 0.7:
        for _ in range(rnd.randrange(1, 4)):
            lines = mutate_structure(lines, rnd)
        with contextlib.suppress(orjson.JSONEncodeError):  # an int orjson will not write
            data = encode(lines)
    for _ in range(rnd.randrange(0, 3)):
        data = mutate_bytes(data, rnd)
    return data


# --------------------------------------------------------------------------- the check


class Fuzz:
    def __init__(self, folder: Path, seconds: float) -> None:
        from gate.core.trace import Trace, encode_trace, read_trace
        from gate.errors import TraceError

        self._read, self._encode, self._trace_cls, self._error = read_trace, encode_trace, Trace, TraceError
        self.folder = folder
        self.path = folder / "input.jsonl"
        self.tried = self.accepted = 0
        self.start = time.monotonic()
        self.deadline = self.start + seconds
        self._next_report = self.start + 10

    def one(self, data: bytes) -> None:
        """Try one input; raise on anything but a Trace (that round-trips) or a TraceError."""
        self.tried += 1
        self.path.write_bytes(data)
        try:
            trace = self._read(self.path)
        except self._error as exc:
            if not str(exc).startswith(str(self.path)):
                raise AssertionError(f"a TraceError that does not name the file: {exc}") from None
            return
        self.accepted += 1
        self.path.write_bytes(self._encode(trace.header, trace.records))
        again = self._read(self.path)
        if again.header != trace.header or [r.to_dict() for r in again.records] != [r.to_dict() for r in trace.records]:
            raise AssertionError("an accepted trace changed through a write and a second read")

    def guarded(self, data: bytes) -> None:
        try:
            self.one(data)
        except Exception:
            name = f"crash-{hashlib.sha1(data).hexdigest()}.jsonl"
            Path(name).write_bytes(data)
            traceback.print_exc()
            print(f"fuzz_trace: CRASH after {self.tried} inputs; the input is saved as {name}", file=sys.stderr)
            sys.stderr.flush()
            self.exit(1)
        now = time.monotonic()
        if now >= self.deadline:
            self.report(final=True)
            self.exit(0)
        if now >= self._next_report:
            self._next_report = now + 10
            self.report(final=False)

    def exit(self, code: int) -> None:
        # libFuzzer never returns to Python: leave now, tidying up by hand.
        shutil.rmtree(self.folder, ignore_errors=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def report(self, *, final: bool) -> None:
        took = time.monotonic() - self.start
        line = (
            f"fuzz_trace: {self.tried} inputs tried in {took:.0f} s ({self.tried / max(took, 1e-9):.0f}/s), "
            f"{self.accepted} accepted, {self.tried - self.accepted} rejected with a TraceError, no crash"
        )
        print(line, file=sys.stdout if final else sys.stderr, flush=True)


def run_random(fuzz: Fuzz, seed: int) -> None:
    rnd = random.Random(seed)
    seeds = [encode(valid_trace(rnd)) for _ in range(500)]
    for s in seeds:  # the seeds themselves must read
        fuzz.guarded(s)
    while True:
        fuzz.guarded(mutate(rnd.choice(seeds), rnd))


def run_atheris(fuzz: Fuzz, seed: int, folder: Path, extra_args: list[str]) -> None:
    import atheris

    corpus = folder / "corpus"
    corpus.mkdir()
    rnd = random.Random(seed)
    for i in range(200):
        (corpus / f"seed{i}.jsonl").write_bytes(encode(valid_trace(rnd)))

    def custom_mutator(data: bytes, max_size: int, mut_seed: int) -> bytes:
        r = random.Random(mut_seed)
        if r.random() < 0.5:
            out = mutate(data, r)
            if len(out) <= max_size:
                return out
        return bytes(atheris.Mutate(data, max_size))

    argv = [sys.argv[0], str(corpus), f"-seed={seed or 1}", "-max_len=65536", "-rss_limit_mb=4096", *extra_args]
    atheris.Setup(argv, fuzz.guarded, custom_mutator=custom_mutator)
    atheris.Fuzz()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz (default 60)")
    ap.add_argument("--engine", choices=("auto", "atheris", "random"), default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("libfuzzer_args", nargs="*", help="extra libFuzzer flags for atheris, after --")
    args = ap.parse_args()

    engine = args.engine
    if engine == "auto":
        try:
            import atheris
        except ImportError:
            engine = "random"
        else:
            engine = "atheris"
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(prefix="gate-fuzz-", dir=shm if shm.is_dir() else None) as tmp:
        folder = Path(tmp)
        if engine == "atheris":
            import atheris

            with atheris.instrument_imports(include=["gate"]):
                import gate.core.trace  # noqa: F401
            fuzz = Fuzz(folder, args.seconds)
            print(f"fuzz_trace: atheris for {args.seconds:.0f} s", file=sys.stderr)
            run_atheris(fuzz, args.seed, folder, args.libfuzzer_args)
        else:
            fuzz = Fuzz(folder, args.seconds)
            print(f"fuzz_trace: random mutations for {args.seconds:.0f} s, seed {args.seed}", file=sys.stderr)
            run_random(fuzz, args.seed)


if __name__ == "__main__":
    main()
