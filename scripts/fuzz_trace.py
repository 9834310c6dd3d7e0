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

A Trace the reader accepts must also survive a write and a second read unchanged. An
accepted oracle is then adjudicated against candidates derived from it (its tokens, some
swapped for rivals or strangers, cut short, with or without forced data) under random
doctrines, and the verdict must mean what it says (no false pass): a candidate whose
tokens differ from the oracle's is never strict; a report never counts a defect and
passes; a run with nothing to compare is an input error (exit 2), never a pass. Any other
exception, or a broken meaning, is a finding: the input is saved as `crash-<sha1>.jsonl`
in the current folder and the script exits 1. At the end it prints how many inputs were
tried and how many adjudications were checked.
"""

from __future__ import annotations

import argparse
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

# The generators and mutations are shared with the tests (one module, no drift).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.trace_fuzzing import encode, mutate, valid_trace

# --------------------------------------------------------------------------- the check


class Fuzz:
    def __init__(self, folder: Path, seconds: float) -> None:
        from gate.core.traces.reader import read_trace
        from gate.core.traces.trace import Trace, encode_trace
        from gate.errors import TraceError

        self._read, self._encode, self._trace_cls, self._error = read_trace, encode_trace, Trace, TraceError
        self.adjudicated = 0
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
        if trace.role == "oracle":
            rnd = random.Random(hashlib.sha1(data).digest())
            for _ in range(3):
                self.adjudicated += check_meaning(trace, rnd)

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
            f"{self.accepted} accepted, {self.tried - self.accepted} rejected with a TraceError, "
            f"{self.adjudicated} adjudications checked for meaning; no crash, no false pass"
        )
        print(line, file=sys.stdout if final else sys.stderr, flush=True)


def derived_candidate(oracle: Any, rnd: random.Random) -> Any:
    """A candidate trace for `oracle`: its tokens, some swapped for a rival in the list or a
    stranger, maybe cut short, maybe with forced data (which may disagree with the run)."""
    from dataclasses import replace

    from gate.core.traces.trace import PromptRecord

    def perturbed(rec: Any) -> tuple[int, ...]:
        out = []
        for i, tok in enumerate(rec.token_ids):
            if rnd.random() < 0.15:
                rivals = [int(t) for t, _ in rec.top_logprobs[i]]
                tok = rnd.choice(rivals) if rivals and rnd.random() < 0.7 else rnd.randrange(0, 300)
            out.append(tok)
        return tuple(out)

    records = []
    for rec in oracle.records:
        tokens = perturbed(rec)
        if tokens and rnd.random() < 0.1:
            tokens = tokens[: rnd.randrange(len(tokens))]
        forced = perturbed(rec) if rnd.random() < 0.4 else None
        records.append(PromptRecord(rec.id, rec.prompt_token_ids, tokens, forced_token_ids=forced))
    header = replace(oracle.header, role="candidate", top_k=0)
    return type(oracle)(header=header, records=tuple(records), path="<derived candidate>")


def check_meaning(oracle: Any, rnd: random.Random) -> int:
    """Adjudicate a derived candidate; raise AssertionError if the verdict lies. Returns 1."""
    from gate.core.verdict.adjudicate import compare
    from gate.core.verdict.doctrine import Doctrine
    from gate.errors import InputError

    cand = derived_candidate(oracle, rnd)
    doctrine = Doctrine(
        near_tie_mnats=rnd.choice((0.0, 125.0, 1000.0, rnd.random() * 5000)),
        near_tie_ulps=rnd.choice((None, None, 1.0, 2.0, 8.0)),
        strict=rnd.random() < 0.3,
    )
    nothing = not any(r.token_ids for r in oracle.records)
    try:
        result = compare(oracle, cand, doctrine)
    except InputError:
        return 1  # exit 2: never a pass
    if nothing:
        raise AssertionError("a run with nothing to compare was adjudicated (it must be exit 2)")
    counts = result.counts
    if counts["defects"] and result.exit_code != 1:
        raise AssertionError(f"the report counts {counts['defects']} defect(s) and exits {result.exit_code}")
    by_id = cand.by_id()
    for rec, p in zip(oracle.records, result.prompts, strict=True):
        if by_id[rec.id].token_ids[: len(rec.token_ids)] != rec.token_ids and p.strict:
            raise AssertionError(f"prompt {rec.id!r}: its tokens differ from the oracle's, yet it is strict")
    if result.exit_code == 0 and any(d.cls == "defect" for d in result.divergences):
        raise AssertionError("a pass with a defect among its divergences")
    return 1


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
                import gate.core.traces.reader  # noqa: F401
            fuzz = Fuzz(folder, args.seconds)
            print(f"fuzz_trace: atheris for {args.seconds:.0f} s", file=sys.stderr)
            run_atheris(fuzz, args.seed, folder, args.libfuzzer_args)
        else:
            fuzz = Fuzz(folder, args.seconds)
            print(f"fuzz_trace: random mutations for {args.seconds:.0f} s, seed {args.seed}", file=sys.stderr)
            run_random(fuzz, args.seed)


if __name__ == "__main__":
    main()
