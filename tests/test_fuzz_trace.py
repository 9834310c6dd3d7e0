"""Fuzzing the trace reader: whatever the bytes, it returns a Trace or raises TraceError.

Valid traces are generated, then mutated the ways files really break and the ways a fuzzer
finds: byte flips, truncations, values swapped for values of other types, reordered lines
and lists, dropped keys, duplicated lines, junk. The examples are bounded so CI stays fast;
`scripts/fuzz_trace.py` runs the same idea for millions of inputs.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gate.core.adjudicate import compare
from gate.core.doctrine import Doctrine
from gate.core.trace import Trace, encode_record, encode_trace, read_trace
from gate.errors import GateError, TraceError

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Ties matter (the tie-break rule); so do the edges of the logprob range.
_LOGPROBS = st.one_of(
    st.sampled_from([0.0, -0.0, -0.125, -0.5, -1.0, -1e-45, -30.0]),
    st.floats(min_value=-40.0, max_value=0.0, allow_nan=False, allow_infinity=False),
)
# Mostly small ids; now and then one where float64 stops telling ids apart (2**53).
_TOKEN = st.one_of(st.integers(min_value=0, max_value=60), st.sampled_from([2**53 - 1, 2**53, 2**53 + 1, 2**64 - 1]))
_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8)


@st.composite
def top_list(draw: st.DrawFn, k: int) -> list[list[Any]]:
    ids = draw(st.lists(_TOKEN, min_size=k, max_size=k, unique=True))
    lps = [draw(_LOGPROBS) for _ in ids]
    pairs = sorted(zip(ids, lps, strict=True), key=lambda p: (-p[1], p[0]))
    return [[t, lp] for t, lp in pairs]


@st.composite
def record(draw: st.DrawFn, rid: str, role: str, top_k: int) -> dict[str, Any]:
    n = draw(st.integers(min_value=0, max_value=4))
    rec: dict[str, Any] = {"id": rid, "prompt_token_ids": draw(st.lists(_TOKEN, max_size=5))}
    with_top = role == "oracle" or (top_k > 0 and draw(st.booleans()))
    if with_top:
        tops = [draw(top_list(top_k)) for _ in range(n)]
        rec["top_logprobs"] = tops
        # The oracle's token is its list's greedy choice: the lowest id among equal maxima.
        rec["token_ids"] = [t[0][0] for t in tops]
    else:
        rec["token_ids"] = draw(st.lists(_TOKEN, min_size=n, max_size=n))
    if draw(st.booleans()):
        rec["finish_reason"] = draw(st.sampled_from(["length", "stop", None]))
    if draw(st.booleans()):
        rec["prompt"] = draw(_TEXT)
    if draw(st.booleans()):
        rec["tokens"] = [draw(_TEXT) for _ in range(n)]
    if role == "candidate" and draw(st.booleans()):
        rec["forced_token_ids"] = draw(st.lists(_TOKEN, min_size=n, max_size=n))
    if draw(st.booleans()):
        rec["token_logits"] = [draw(st.floats(-50, 50)) for _ in range(n)]
    return rec


@st.composite
def trace_lines(draw: st.DrawFn, role: str | None = None) -> list[dict[str, Any]]:
    role = role or draw(st.sampled_from(["oracle", "candidate"]))
    top_k = draw(st.integers(min_value=1 if role == "oracle" else 0, max_value=4))
    header: dict[str, Any] = {
        "gate_trace": 1,
        "role": role,
        "model": draw(st.sampled_from(["org/tiny", "HuggingFaceTB/SmolLM2-135M-Instruct"])),
        "top_k": top_k,
        "engine": {"name": "vllm", "version": "0.11.0", "options": {"dtype": "bfloat16"}},
    }
    if draw(st.booleans()):
        header["created_at"] = "2025-01-01T00:00:00Z"
    ids = draw(st.lists(_TEXT.filter(bool), max_size=4, unique=True))
    return [header, *(draw(record(rid, role, top_k)) for rid in ids)]


def encode_lines(lines: list[Any]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


# --------------------------------------------------------------------------- mutations

WEIRD: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    7,
    2**31,
    2**53 + 1,
    2**63,
    2**64 - 1,
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


@st.composite
def structural_mutation(draw: st.DrawFn, lines: list[Any]) -> list[Any]:
    """One change to the parsed lines: a type swap, a drop, a reorder, a duplicate."""
    lines = copy.deepcopy(lines)
    op = draw(st.sampled_from(["swap_type", "drop_key", "reorder_list", "swap_lines", "dup_line", "tweak_number"]))
    if op in ("swap_lines", "dup_line") and lines:
        i = draw(st.integers(0, len(lines) - 1))
        j = draw(st.integers(0, len(lines) - 1))
        if op == "swap_lines":
            lines[i], lines[j] = lines[j], lines[i]
        else:
            lines.insert(j, copy.deepcopy(lines[i]))
        return lines
    spots = _containers(lines, [])
    spot = draw(st.sampled_from(spots))
    keys = list(spot) if isinstance(spot, dict) else list(range(len(spot)))
    if not keys:
        return lines
    key = draw(st.sampled_from(keys))
    if op == "swap_type":
        spot[key] = draw(st.sampled_from(WEIRD))
    elif op == "drop_key":
        del spot[key]
    elif op == "reorder_list" and isinstance(spot, list) and len(spot) > 1:
        j = draw(st.integers(0, len(spot) - 1))
        spot[key], spot[j] = spot[j], spot[key]
    elif op == "tweak_number" and isinstance(spot[key], int | float) and not isinstance(spot[key], bool):
        value = spot[key]
        spot[key] = draw(st.sampled_from([-value, value + 1, value - 1, value * 2, value / 3 if value else 1.5]))
    return lines


@st.composite
def byte_mutation(draw: st.DrawFn, data: bytes) -> bytes:
    """One change to the raw bytes: a flip, a cut, junk in, a span out, a newline in or out."""
    if not data:
        return draw(st.binary(max_size=16))
    op = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "newline"]))
    i = draw(st.integers(0, len(data) - 1))
    if op == "flip":
        return data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1 :]
    if op == "truncate":
        return data[:i]
    if op == "insert":
        return data[:i] + draw(st.binary(min_size=1, max_size=8)) + data[i:]
    if op == "delete":
        return data[:i] + data[i + draw(st.integers(1, 16)) :]
    return data[:i] + b"\n" + data[i:] if draw(st.booleans()) else data.replace(b"\n", b" ", 1)


@st.composite
def mutated_trace(draw: st.DrawFn) -> bytes:
    lines: list[Any] = draw(trace_lines())
    for _ in range(draw(st.integers(0, 3))):
        lines = draw(structural_mutation(lines))
    try:
        data = encode_lines(lines)
    except orjson.JSONEncodeError:  # an int orjson will not write: skip that mutation
        data = encode_lines(draw(trace_lines()))
    for _ in range(draw(st.integers(0 if lines else 1, 2))):
        data = draw(byte_mutation(data))
    return data


# --------------------------------------------------------------------------- properties


@pytest.fixture(scope="module")
def scratch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def scratch(scratch_dir: Path) -> Path:
    return scratch_dir / "trace.jsonl"


def _read(path: Path, data: bytes) -> Trace | TraceError:
    path.write_bytes(data)
    try:
        return read_trace(path)
    except TraceError as exc:
        return exc


@settings(FUZZ, max_examples=100)
@given(lines=trace_lines())
def test_generated_traces_are_valid_and_round_trip(scratch: Path, lines: list[dict[str, Any]]) -> None:
    # The mutations below start from these: they must be valid, or the fuzzing proves little.
    got = _read(scratch, encode_lines(lines))
    assert isinstance(got, Trace), got
    assert got.header.to_dict() == lines[0]
    # (A null finish_reason is written as no finish_reason: the same thing in v1.)
    expected = [{k: v for k, v in rec.items() if v is not None} for rec in lines[1:]]
    assert [orjson.loads(encode_record(r)) for r in got.records] == expected


@FUZZ
@given(data=mutated_trace())
def test_mutated_traces_give_a_trace_or_a_trace_error(scratch: Path, data: bytes) -> None:
    got = _read(scratch, data)  # any other exception fails the test
    if isinstance(got, TraceError):
        assert got.path == str(scratch)
        assert str(got).startswith(str(scratch))
        return
    # Whatever the reader accepts, the writer writes back and the reader reads again the same.
    again = _read(scratch, encode_trace(got.header, got.records))
    assert isinstance(again, Trace), again
    assert again.header == got.header
    assert [r.to_dict() for r in again.records] == [r.to_dict() for r in got.records]


@settings(FUZZ, max_examples=100)
@given(oracle=trace_lines(role="oracle"), data=st.data())
def test_compare_never_crashes_on_traces_the_reader_accepts(
    scratch_dir: Path, oracle: list[dict[str, Any]], data: st.DataObject
) -> None:
    """A candidate made from the oracle, then mutated: adjudication answers or names an input error."""
    folder = scratch_dir
    cand: list[Any] = copy.deepcopy(oracle)
    cand[0] = dict(cand[0], role="candidate")
    for _ in range(data.draw(st.integers(0, 2))):
        cand = data.draw(structural_mutation(cand))
    o = _read(folder / "o.jsonl", encode_lines(oracle))
    assert isinstance(o, Trace)
    try:
        c = _read(folder / "c.jsonl", encode_lines(cand))
    except orjson.JSONEncodeError:
        return
    if isinstance(c, TraceError):
        return
    try:
        result = compare(o, c, Doctrine())
    except GateError:
        return
    assert result.verdict in ("strict_pass", "ratified_pass", "fail")
