"""Fuzzing the trace reader: whatever the bytes, it returns a Trace or raises TraceError.

Valid traces are generated, then mutated the ways files really break and the ways a fuzzer
finds: byte flips, truncations, values swapped for values of other types, reordered lines
and lists, dropped keys, duplicated lines, junk. The examples are bounded so CI stays fast;
`scripts/fuzz_trace.py` runs the same idea for millions of inputs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gate.core.traces.reader import read_trace
from gate.core.traces.trace import Trace, encode_record, encode_trace
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.doctrine import Doctrine
from gate.errors import GateError, TraceError

sys.path.insert(0, str(Path(__file__).parents[1]))
from helpers import trace_fuzzing

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# The generators and mutations are `trace_fuzzing`'s, the very ones `scripts/fuzz_trace.py`
# runs for millions of inputs; hypothesis drives their `random.Random` and shrinks failures.
_RANDOM = st.randoms(use_true_random=False)


@st.composite
def trace_lines(draw: st.DrawFn, role: str | None = None) -> list[dict[str, Any]]:
    return trace_fuzzing.valid_trace(draw(_RANDOM), role)


def encode_lines(lines: list[Any]) -> bytes:
    return trace_fuzzing.encode(lines)


@st.composite
def mutated_trace(draw: st.DrawFn) -> bytes:
    rnd = draw(_RANDOM)
    return trace_fuzzing.mutate(encode_lines(trace_fuzzing.valid_trace(rnd)), rnd)


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
    cand: list[Any] = [dict(oracle[0], role="candidate"), *oracle[1:]]
    rnd = data.draw(_RANDOM)
    for _ in range(data.draw(st.integers(0, 2))):
        cand = trace_fuzzing.mutate_structure(cand, rnd)  # works on a deep copy
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
    assert_no_false_pass(o, c, result)


def assert_no_false_pass(o: Trace, c: Trace, result: Any) -> None:
    """The meaning of a verdict, whatever the input: no false pass."""
    counts = result.counts
    # Nothing to compare never passes (compare refuses it: we never get here with it).
    assert counts["prompts"] > 0 and counts["positions"] > 0
    # A report never counts a defect and passes.
    if counts["defects"]:
        assert result.exit_code == 1 and result.verdict == "fail"
    # A candidate whose tokens differ from the oracle's is never strict.
    cand = c.by_id()
    for rec, p in zip(o.records, result.prompts, strict=True):
        differs = cand[rec.id].token_ids[: len(rec.token_ids)] != rec.token_ids
        assert not (differs and p.strict), rec.id
    if any(cand[r.id].token_ids[: len(r.token_ids)] != r.token_ids for r in o.records):
        assert result.verdict != "strict_pass"
