"""Small trace builders for the adjudication and report tests (no engine, no torch).

Logprobs are chosen so that gaps are exact in binary: -0.5 vs -0.625 is 125.0 mnats bit
for bit, which is what the boundary tests need.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from gate.core.traces.reader import read_trace
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.result import GateResult

# The spec's seed example, kept in the repository (docs/spec.md, docs/examples/).
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
SEED_ORACLE = EXAMPLES / "seed-oracle.jsonl"
SEED_CANDIDATE = EXAMPLES / "seed-candidate.jsonl"

PROMPT = (11, 12, 13)


def header(role: str, **extra: Any) -> dict[str, Any]:
    return {
        "gate_trace": 1,
        "role": role,
        "model": "test/model",
        "top_k": 4 if role == "oracle" else 0,
        "engine": {"name": "oracle-engine" if role == "oracle" else "candidate-engine", "version": "1"},
        **extra,
    }


def position(chosen: int, *others: tuple[int, float], lp: float = -0.5) -> list[list[Any]]:
    """A top-k list: `chosen` at logprob `lp`, each other token `(id, logprob)` as given,
    sorted as the spec orders them (logprob descending, then id ascending)."""
    pairs = [[chosen, lp], *[[t, v] for t, v in others]]
    pairs.sort(key=lambda p: (-p[1], p[0]))
    return pairs


def filler(chosen: int) -> list[list[Any]]:
    """An unremarkable position: the chosen token far ahead of three others."""
    return position(chosen, (chosen + 1000, -3.0), (chosen + 1001, -4.0), (chosen + 1002, -5.0), lp=-0.25)


def oracle_record(
    pid: str,
    tops: Sequence[list[list[Any]]],
    *,
    prompt: str | None = None,
    tokens: Sequence[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "id": pid,
        "prompt_token_ids": list(PROMPT),
        "token_ids": [t[0][0] for t in tops],
        "top_logprobs": [list(t) for t in tops],
        "finish_reason": "length",
    }
    if prompt is not None:
        rec["prompt"] = prompt
    if tokens is not None:
        rec["tokens"] = list(tokens)
    rec.update(extra)
    return rec


def candidate_record(pid: str, token_ids: Iterable[int], **extra: Any) -> dict[str, Any]:
    return {"id": pid, "prompt_token_ids": list(PROMPT), "token_ids": list(token_ids), **extra}


def write_jsonl(path: Path, head: dict[str, Any], records: Iterable[dict[str, Any]]) -> Path:
    with open(path, "wb") as fh:
        fh.write(orjson.dumps(head) + b"\n")
        for rec in records:
            fh.write(orjson.dumps(rec) + b"\n")
    return path


def write_pair(
    folder: Path, oracle: Sequence[dict[str, Any]], candidate: Sequence[dict[str, Any]], *, name: str = "t"
) -> tuple[Path, Path]:
    o = write_jsonl(folder / f"{name}-oracle.jsonl", header("oracle"), oracle)
    c = write_jsonl(folder / f"{name}-candidate.jsonl", header("candidate"), candidate)
    return o, c


def mixed_records() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every outcome the gate knows, one prompt each (or two where they share a prompt):

    strict; an exact tie won by the higher id; a near tie; a defect; a candidate token
    outside the top-k; a candidate that stops early; forced data where an early exact tie
    and a later defect share a prompt (decode mode); a forced near tie (prefill mode).
    """
    oracle: list[dict[str, Any]] = []
    cand: list[dict[str, Any]] = []
    base = [filler(100 + i) for i in range(8)]

    oracle.append(oracle_record("strict", base, prompt="The quick brown fox"))
    cand.append(candidate_record("strict", [t[0][0] for t in base]))

    tie = list(base)
    tie[3] = position(464, (1445, -0.5), (2000, -1.9), (344, -2.2))
    toks = ["t0", "t1", "t2", "import", "t4", "t5", "t6", "t7"]
    oracle.append(oracle_record("tie", tie, prompt="import numpy as np", tokens=toks))
    free = [t[0][0] for t in tie]
    free[3:] = [1445, 900, 901, 902, 903]
    cand.append(candidate_record("tie", free, tokens=[*toks[:3], "from", "a", "b", "c", "d"]))

    near = list(base)
    near[5] = position(50, (51, -0.625), (52, -2.0), (53, -3.0))  # 125.0 mnats
    oracle.append(oracle_record("near", near, prompt="near | tie `x`\nline two"))
    free = [t[0][0] for t in near]
    free[5:] = [51, 700, 701]
    cand.append(candidate_record("near", free))

    defect = list(base)
    defect[2] = position(60, (61, -1.5), (62, -2.0), (63, -3.0))  # 1000 mnats
    oracle.append(oracle_record("defect", defect, prompt="2 + 2 ="))
    free = [t[0][0] for t in defect]
    free[2:] = [61, 1, 2, 3, 4, 5]
    cand.append(candidate_record("defect", free))

    outside = list(base)
    oracle.append(oracle_record("outside", outside))
    free = [t[0][0] for t in outside]
    free[6] = 99_999
    cand.append(candidate_record("outside", free[:7]))

    oracle.append(oracle_record("stopped", base))
    cand.append(candidate_record("stopped", [t[0][0] for t in base][:4], finish_reason="stop"))

    forced = list(base)
    forced[1] = position(70, (71, -0.5), (72, -2.0), (73, -3.0))  # exact tie, candidate takes 71
    forced[6] = position(80, (81, -2.5), (82, -3.0), (83, -4.0))  # 2000 mnats: a defect
    oracle.append(oracle_record("forced", forced, prompt="tie first, defect later"))
    f_ids = [t[0][0] for t in forced]
    f_ids[1], f_ids[6] = 71, 81
    free = [t[0][0] for t in forced]
    free[1:] = [71, 500, 501, 502, 503, 504, 505]
    cand.append(candidate_record("forced", free, forced_token_ids=f_ids, forced_mode="decode"))

    prefill = list(base)
    prefill[4] = position(90, (91, -0.5625), (92, -2.0), (93, -3.0))  # 62.5 mnats: near tie
    oracle.append(oracle_record("prefill", prefill))
    p_ids = [t[0][0] for t in prefill]
    p_ids[4] = 91
    cand.append(candidate_record("prefill", [t[0][0] for t in prefill], forced_token_ids=p_ids, forced_mode="prefill"))
    return oracle, cand


def mixed_result(folder: Path, doctrine: Doctrine | None = None, **meta: Any) -> GateResult:
    """`compare` over `mixed_records()`, read back from files as the CLI would."""
    o, c = write_pair(folder, *mixed_records(), name="mixed")
    result = compare(read_trace(o), read_trace(c), doctrine or Doctrine())
    result.meta.update(meta)
    return result
