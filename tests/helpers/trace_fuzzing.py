"""Fuzzing inputs for the trace reader, shared by `scripts/fuzz_trace.py` (millions of
inputs from a seeded `random.Random`, or atheris) and `tests/core/test_trace_fuzzing.py`
(hypothesis drives the same functions through `st.randoms()`, so it shrinks what fails).

Valid traces are generated, then mutated the ways files really break and the ways a fuzzer
finds: byte flips, truncations, values swapped for values of other types, reordered lines
and lists, dropped keys, duplicated lines, junk.
"""

from __future__ import annotations

import contextlib
import copy
import random
from typing import Any

import orjson

# --------------------------------------------------------------------------- valid seeds

# Ties matter (the tie-break rule); so do the edges of the logprob range.
_EDGE_LOGPROBS = (0.0, -0.0, -0.125, -0.5, -1.0, -1e-45, -30.0)
# Now and then an id where float64 stops telling ids apart (2**53), or u64's largest.
_BIG_IDS = (2**53 - 1, 2**53, 2**53 + 1, 2**64 - 1)
_CHARS = 'ab é\u00e9\u4e2d\U0001f600"\\\n\t{}[]\u0000'


def _token(rnd: random.Random) -> int:
    return rnd.choice(_BIG_IDS) if rnd.random() < 0.05 else rnd.randrange(0, 61)


def _logprob(rnd: random.Random) -> float:
    return rnd.choice(_EDGE_LOGPROBS) if rnd.random() < 0.4 else -rnd.random() * 40.0


def _text(rnd: random.Random) -> str:
    return "".join(rnd.choice(_CHARS) for _ in range(rnd.randrange(0, 8)))


def top_list(rnd: random.Random, k: int) -> list[list[Any]]:
    """k distinct ids with logprobs, in the trace's order: logprob descending, then id ascending."""
    ids: list[int] = []
    while len(ids) < k:
        t = _token(rnd)
        if t not in ids:
            ids.append(t)
    pairs = sorted(((t, _logprob(rnd)) for t in ids), key=lambda p: (-p[1], p[0]))
    return [[t, lp] for t, lp in pairs]


def record(rnd: random.Random, rid: str, role: str, top_k: int) -> dict[str, Any]:
    n = rnd.randrange(0, 5)
    rec: dict[str, Any] = {"id": rid, "prompt_token_ids": [_token(rnd) for _ in range(rnd.randrange(0, 6))]}
    if role == "oracle" or (top_k > 0 and rnd.random() < 0.5):
        tops = [top_list(rnd, top_k) for _ in range(n)]
        rec["top_logprobs"] = tops
        rec["token_ids"] = [t[0][0] for t in tops]  # greedy: the lowest id among equal maxima
    else:
        rec["token_ids"] = [_token(rnd) for _ in range(n)]
    if rnd.random() < 0.5:
        rec["finish_reason"] = rnd.choice(("length", "stop", None))
    if rnd.random() < 0.3:
        rec["prompt"] = _text(rnd)
    if rnd.random() < 0.3:
        rec["tokens"] = [_text(rnd) for _ in range(n)]
    if role == "candidate" and rnd.random() < 0.3:
        rec["forced_token_ids"] = [_token(rnd) for _ in range(n)]
    if rnd.random() < 0.3:
        rec["token_logits"] = [rnd.uniform(-50.0, 50.0) for _ in range(n)]
    return rec


def valid_trace(rnd: random.Random, role: str | None = None) -> list[dict[str, Any]]:
    """A valid trace v1 as JSON values: the header, then up to five records."""
    role = role or rnd.choice(("oracle", "candidate"))
    top_k = rnd.randrange(1 if role == "oracle" else 0, 5)
    header: dict[str, Any] = {
        "gate_trace": 1,
        "role": role,
        "model": rnd.choice(("org/tiny", "HuggingFaceTB/SmolLM2-135M-Instruct")),
        "top_k": top_k,
        "engine": {"name": "vllm", "version": "0.11.0", "options": {"dtype": "bfloat16"}},
    }
    if rnd.random() < 0.5:
        header["created_at"] = "2025-01-01T00:00:00Z"
    return [header, *(record(rnd, f"p{i}{_text(rnd)}", role, top_k) for i in range(rnd.randrange(0, 6)))]


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
    7,
    *_BIG_IDS,
    2**63,
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
    "é",
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
