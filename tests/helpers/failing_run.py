"""A failing run like the README's llama.cpp Q4_1 build, without llama.cpp: the default pin's
oracle trace against a candidate built from it, with a few flips far below the oracle's
top token (defects), a few at its near ties, and every top-k list sharpened so that the
distribution sits beyond the pin's honest floor (mean KL about 2x the floor, as Q4_1 does).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson

from gate.core.traces.reader import read_trace
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.doctrine import header_doctrine, resolve_doctrine
from gate.core.verdict.result import GateResult

ROOT = Path(__file__).resolve().parents[2]
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
PIN = ROOT / "oracle_pins" / MODEL / "pin.jsonl"
# Sharpening of every candidate list: log-probabilities times this, renormalised.
SHARPEN = 1.06
DEFECT_PROMPTS = 4
NEAR_TIE_PROMPTS = 6


def _sharpen(top: list[list[Any]], factor: float) -> list[list[Any]]:
    scaled = [(int(t), float(lp) * factor) for t, lp in top]
    m = max(lp for _, lp in scaled)
    lse = m + math.log(math.fsum(math.exp(lp - m) for _, lp in scaled))
    return [[t, lp - lse] for t, lp in sorted(scaled, key=lambda x: (-x[1], x[0]))]


def _flip(top: list[list[Any]], token: int) -> list[list[Any]]:
    """The candidate's own list at a flip: its token on top, just above the oracle's."""
    lps = {int(t): float(lp) for t, lp in top}
    best = max(lps.values())
    lps[token] = best + 0.001
    return [[t, lp] for t, lp in sorted(lps.items(), key=lambda x: (-x[1], x[0]))]


def failing_pair(folder: Path) -> tuple[Path, Path]:
    """(oracle, candidate) trace files: the pin itself and the planted candidate."""
    lines = PIN.read_bytes().splitlines()
    head = orjson.loads(lines[0])
    records = [orjson.loads(x) for x in lines[1:] if x.strip()]
    cand_head = {"gate_trace": 1, "role": "candidate", "model": head["model"], "top_k": head["top_k"]}
    cand_head["engine"] = {"name": "llamacpp", "version": "planted Q4_1-like build"}
    out = []
    defects = near = 0
    for rec in records:
        tops = [_sharpen(t, SHARPEN) for t in rec["top_logprobs"]]
        tokens = list(rec["token_ids"])
        for i, top in enumerate(rec["top_logprobs"]):
            if len(top) < 3 or i < 3:
                continue
            gap = float(top[0][1]) - float(top[1][1])
            if defects < DEFECT_PROMPTS and gap > 0.8:
                tokens[i] = int(top[2][0])
                tops[i] = _flip(tops[i], tokens[i])
                defects += 1
                break
            if near < NEAR_TIE_PROMPTS and defects >= DEFECT_PROMPTS and 0.0 < gap < 0.08:
                tokens[i] = int(top[1][0])
                tops[i] = _flip(tops[i], tokens[i])
                near += 1
                break
        cand = {
            "id": rec["id"],
            "prompt_token_ids": rec["prompt_token_ids"],
            "token_ids": tokens,
            "top_logprobs": tops,
            "finish_reason": "length",
        }
        if tokens != list(rec["token_ids"]):
            # Teacher-forced along the oracle's tokens, as `gate run` forces a prompt that
            # diverged: the same choices and lists (the flip is the build's own choice there).
            cand["forced_token_ids"] = tokens
            cand["forced_top_logprobs"] = tops
        out.append(cand)
    oracle = folder / "oracle.jsonl"
    oracle.write_bytes(PIN.read_bytes())
    candidate = folder / "candidate.jsonl"
    candidate.write_bytes(b"\n".join(orjson.dumps(x) for x in [cand_head, *out]) + b"\n")
    return oracle, candidate


def failing_result(folder: Path) -> GateResult:
    """The verdict `gate compare` gives on `failing_pair` (the pin's doctrine and floor)."""
    oracle, candidate = failing_pair(folder)
    o = read_trace(oracle, role="oracle")
    c = read_trace(candidate, role="candidate")
    doctrine = resolve_doctrine(header_doctrine(o.header.extra, str(oracle)), source=f"the pin's ({oracle})")
    return compare(o, c, doctrine)
