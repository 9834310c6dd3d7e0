"""Trace format v1: every rejection the spec lists (file, line and field named; exit 2 via
the CLI, no traceback), the writer's round trip, and the compact top-k form."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from helpers.gate_cli import invoke
from helpers.trace_builders import candidate_record, filler, header, oracle_record, position, write_jsonl

from gate.core.traces.reader import read_trace
from gate.core.traces.trace import PromptRecord, TopLogprobs, Trace, TraceHeader, write_trace
from gate.core.traces.validate import check_top_logprobs
from gate.errors import TraceError

Rec = dict[str, Any]


def good_oracle() -> list[Rec]:
    tops = [filler(100), position(464, (1445, -0.5), (2000, -1.9), (344, -2.2)), filler(102)]
    return [
        header("oracle"),
        oracle_record("a", tops, prompt="hello"),
        oracle_record("b", [filler(7), filler(8)]),
    ]


def good_candidate() -> list[Rec]:
    return [header("candidate"), candidate_record("a", [100, 464, 102]), candidate_record("b", [7, 8])]


def write_lines(path: Path, lines: list[Any]) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else orjson.dumps(x)) + b"\n" for x in lines))
    return path


def _set(line: int, key: str, value: Any) -> Callable[[list[Any]], None]:
    def edit(lines: list[Any]) -> None:
        lines[line - 1][key] = value

    return edit


def _top(line: int, i: int, value: Any) -> Callable[[list[Any]], None]:
    def edit(lines: list[Any]) -> None:
        lines[line - 1]["top_logprobs"][i] = value

    return edit


def _drop(line: int, key: str) -> Callable[[list[Any]], None]:
    def edit(lines: list[Any]) -> None:
        del lines[line - 1][key]

    return edit


def _raw(line: int, data: bytes) -> Callable[[list[Any]], None]:
    def edit(lines: list[Any]) -> None:
        lines[line - 1] = data

    return edit


# (case, edit of good_oracle(), line, field named in the message, words in the message)
ORACLE_REJECTIONS: list[tuple[str, Callable[[list[Any]], None], int, str | None, str]] = [
    ("bad JSON", _raw(2, b'{"id": "a", '), 2, None, "bad JSON"),
    ("not UTF-8", _raw(3, b'{"id": "\xff"}'), 3, None, "UTF-8"),
    ("header missing gate_trace", _drop(1, "gate_trace"), 1, "gate_trace", "missing"),
    ("header version 2", _set(1, "gate_trace", 2), 1, "gate_trace", "unsupported"),
    ("header bad role", _set(1, "role", "judge"), 1, "role", "oracle"),
    ("header model not a string", _set(1, "model", 5), 1, "model", "string"),
    ("header top_k 0 for an oracle", _set(1, "top_k", 0), 1, "top_k", ">= 1"),
    ("header engine without version", _set(1, "engine", {"name": "x"}), 1, "engine.version", "missing"),
    ("missing id", _drop(2, "id"), 2, "id", "missing"),
    ("id not a string", _set(2, "id", 7), 2, "id", "string"),
    ("missing token_ids", _drop(2, "token_ids"), 2, "token_ids", "missing"),
    ("missing prompt_token_ids", _drop(3, "prompt_token_ids"), 3, "prompt_token_ids", "missing"),
    ("missing top_logprobs in an oracle", _drop(3, "top_logprobs"), 3, "top_logprobs", "missing"),
    ("token_ids a string", _set(2, "token_ids", "100 464"), 2, "token_ids", "list"),
    ("float token id", _set(3, "prompt_token_ids", [1, 2.0]), 3, "prompt_token_ids[1]", "integer"),
    ("bool token id", _set(3, "prompt_token_ids", [True, 2]), 3, "prompt_token_ids[0]", "integer"),
    ("negative token id", _set(3, "prompt_token_ids", [1, -2]), 3, "prompt_token_ids[1]", "negative"),
    ("negative id in a top list", _top(3, 1, [[8, -0.25], [-1, -3.0]]), 3, "top_logprobs[1][1]", "negative"),
    ("float id in a top list", _top(3, 1, [[8, -0.25], [9.0, -3.0]]), 3, "top_logprobs[1][1]", "integer"),
    ("bool id in a top list", _top(3, 1, [[8, -0.25], [True, -3.0]]), 3, "top_logprobs[1][1]", "integer"),
    ("string logprob", _top(3, 1, [[8, -0.25], [9, "-3.0"]]), 3, "top_logprobs[1][1]", "number"),
    ("bool logprob", _top(3, 1, [[8, -0.25], [9, False]]), 3, "top_logprobs[1][1]", "number"),
    (
        "infinite logprob",
        _raw(3, b'{"id":"b","prompt_token_ids":[1],"token_ids":[8],"top_logprobs":[[[8,-1e999]]]}'),
        3,
        None,
        "infinity",
    ),
    (
        "NaN logprob",
        _raw(3, b'{"id":"b","prompt_token_ids":[1],"token_ids":[8],"top_logprobs":[[[8,NaN]]]}'),
        3,
        None,
        "bad JSON",
    ),
    ("logprob above 0", _top(3, 1, [[8, 0.25], [9, -3.0]]), 3, "top_logprobs[1][0]", "above 0"),
    ("pair of three", _top(3, 1, [[8, -0.25, 1], [9, -3.0]]), 3, "top_logprobs[1][0]", "pair"),
    ("pair of one", _top(3, 1, [[8, -0.25], [9]]), 3, "top_logprobs[1][1]", "pair"),
    ("position not a list", _top(3, 1, {"8": -0.25}), 3, "top_logprobs[1]", "list"),
    ("empty oracle position", _top(3, 1, []), 3, "top_logprobs[1]", "empty"),
    (
        "out of order by logprob",
        _top(3, 1, [[8, -0.25], [9, -3.0], [10, -2.0]]),
        3,
        "top_logprobs[1][2]",
        "out of order",
    ),
    ("tie out of id order", _top(3, 1, [[8, -0.25], [20, -3.0], [10, -3.0]]), 3, "top_logprobs[1][2]", "out of order"),
    ("repeated token id", _top(3, 1, [[8, -0.25], [9, -3.0], [9, -4.0]]), 3, "top_logprobs[1][2]", "twice"),
    ("chosen token absent", _top(3, 1, [[9, -0.25], [10, -3.0]]), 3, "top_logprobs[1]", "does not contain"),
    ("chosen token not greedy", _top(3, 1, [[9, -0.1], [8, -0.25]]), 3, "top_logprobs[1]", "not the greedy"),
    ("oracle took the higher id of a tie", _set(2, "token_ids", [100, 1445, 102]), 2, "top_logprobs[1]", "lowest id"),
    ("positions fewer than tokens", _set(3, "top_logprobs", [filler(7)]), 3, "top_logprobs", "1 positions"),
    ("duplicate id", _set(3, "id", "a"), 3, "id", "duplicate"),
    ("bad finish_reason", _set(2, "finish_reason", "eos"), 2, "finish_reason", "length"),
    ("tokens of the wrong length", _set(2, "tokens", ["x"]), 2, "tokens", "entries"),
    ("tokens not strings", _set(2, "tokens", [1, 2, 3]), 2, "tokens", "strings"),
    ("forced_token_ids in an oracle", _set(2, "forced_token_ids", [1, 2, 3]), 2, "forced_token_ids", "candidate"),
    ("record not an object", _raw(3, b"[1, 2]"), 3, None, "object"),
]


@pytest.mark.parametrize(
    ("case", "edit", "line", "field", "words"), ORACLE_REJECTIONS, ids=[c[0] for c in ORACLE_REJECTIONS]
)
def test_reader_rejects(
    tmp_path: Path, case: str, edit: Callable[[list[Any]], None], line: int, field: str | None, words: str
) -> None:
    lines: list[Any] = copy.deepcopy(good_oracle())
    edit(lines)
    path = write_lines(tmp_path / "oracle.jsonl", lines)
    with pytest.raises(TraceError) as info:
        read_trace(path)
    err = info.value
    assert err.path == str(path)
    assert err.line == line, str(err)
    assert err.field == field, str(err)
    assert words.lower() in str(err).lower(), str(err)
    message = str(err)
    assert message.startswith(f"{path}:{line}: "), message
    if field is not None:
        assert f"field '{field}'" in message


@pytest.mark.parametrize(
    ("case", "edit", "line", "field", "words"), ORACLE_REJECTIONS[::3], ids=[c[0] for c in ORACLE_REJECTIONS[::3]]
)
def test_cli_rejection_exits_2_without_traceback(
    tmp_path: Path, case: str, edit: Callable[[list[Any]], None], line: int, field: str | None, words: str
) -> None:
    lines: list[Any] = copy.deepcopy(good_oracle())
    edit(lines)
    oracle = write_lines(tmp_path / "oracle.jsonl", lines)
    candidate = write_lines(tmp_path / "candidate.jsonl", good_candidate())
    r = invoke(["compare", str(oracle), str(candidate)])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.stderr
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1, r.stderr  # one line
    assert f"{oracle}:{line}" in r.stderr
    if field is not None:
        assert field in r.stderr


def test_good_files_are_accepted(tmp_path: Path) -> None:
    o = read_trace(write_lines(tmp_path / "o.jsonl", good_oracle()), role="oracle")
    c = read_trace(write_lines(tmp_path / "c.jsonl", good_candidate()), role="candidate")
    assert [r.id for r in o.records] == ["a", "b"]
    assert o.records[0].prompt == "hello"
    assert c.records[0].top_logprobs is None
    assert isinstance(o.records[0].top_logprobs, TopLogprobs)


def test_role_mismatch_is_named(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "c.jsonl", good_candidate())
    with pytest.raises(TraceError, match="expected an oracle trace") as info:
        read_trace(path, role="oracle")
    assert info.value.line == 1
    assert info.value.field == "role"


def test_empty_and_missing_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"\n\n")
    with pytest.raises(TraceError, match="empty file"):
        read_trace(empty)
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "absent.jsonl")


def test_blank_lines_keep_line_numbers(tmp_path: Path) -> None:
    lines: list[Any] = good_oracle()
    path = tmp_path / "o.jsonl"
    body = orjson.dumps(lines[0]) + b"\n\n\n" + orjson.dumps(lines[1]) + b"\n" + orjson.dumps(lines[1]) + b"\n"
    path.write_bytes(body)
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert info.value.line == 5  # the duplicate, after two blank lines
    assert "first on line 4" in str(info.value)


def test_candidate_may_have_unsorted_free_top_lists_but_not_bad_ones(tmp_path: Path) -> None:
    # A candidate's own top lists are optional and need not contain its token, but must be well-formed.
    lines: list[Any] = good_candidate()
    lines[0]["top_k"] = 2  # a candidate with lists says how many it keeps (0 means none)
    lines[2]["top_logprobs"] = [[[9, -0.1]], [[3, -0.2], [4, -0.3]]]  # ragged k, chosen tokens absent: fine
    read_trace(write_lines(tmp_path / "c.jsonl", lines))
    lines[2]["top_logprobs"] = [[[9, -0.1]], [[3, -0.3], [4, -0.2]]]
    with pytest.raises(TraceError, match="out of order") as info:
        read_trace(write_lines(tmp_path / "c2.jsonl", lines))
    assert info.value.field == "top_logprobs[1][1]"


# --------------------------------------------------------------------------- writer


def test_write_then_read_is_bit_exact(tmp_path: Path) -> None:
    lp = float(np.float32(-0.8293954133987427))
    tops = [position(464, (1445, lp), lp=lp), position(3, (9, -1e-7), lp=-0.0), position(5, (6, -3.0), lp=0)]
    rec = oracle_record("x", tops, tokens=["import", "a", "b"], token_logits=[17.25, 3.0, 1.0])
    path = write_jsonl(tmp_path / "o.jsonl", header("oracle", dtype="bfloat16"), [rec])
    trace = read_trace(path)
    out = tmp_path / "copy.jsonl"
    write_trace(out, trace)
    again = read_trace(out)
    assert again.header == trace.header
    assert again.records == trace.records
    got = again.records[0]
    assert got.extra == {} and got.token_logits == [17.25, 3.0, 1.0]
    assert got.top_logprobs is not None
    assert got.top_logprobs[0] == [[464, lp], [1445, lp]]
    assert got.top_logprobs[0][0][1] == lp and got.top_logprobs[0][1][1] == lp
    assert np.signbit(got.top_logprobs[1][0][1])  # -0.0 stays -0.0
    assert orjson.loads(out.read_bytes().split(b"\n")[1])["top_logprobs"][0] == [[464, lp], [1445, lp]]


def test_writer_refuses_to_overwrite(tmp_path: Path) -> None:
    trace = Trace(TraceHeader("candidate", "m", 0, {"name": "e", "version": "1"}), (PromptRecord("p", (1,), (2,)),))
    path = tmp_path / "t.jsonl"
    write_trace(path, trace)
    with pytest.raises(Exception, match="already exists"):
        write_trace(path, trace)
    write_trace(path, trace, overwrite=True)
    assert read_trace(path).records[0].token_ids == (2,)
    assert [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]  # no temporary file left behind


# --------------------------------------------------------------------------- compact top-k


def test_top_logprobs_reads_like_lists() -> None:
    ids = np.array([[5, 7], [6, 5]])
    lps = np.array([[-0.1, -2.5], [-0.25, -1.5]])
    top = TopLogprobs(ids, lps)
    assert len(top) == 2
    assert top[1] == [[6, -0.25], [5, -1.5]]
    assert type(top[1][0][0]) is int and type(top[1][0][1]) is float
    assert top[-1] == top[1]
    assert top[0:1] == [[[5, -0.1], [7, -2.5]]]
    assert list(top) == top.tolist() == [[[5, -0.1], [7, -2.5]], [[6, -0.25], [5, -1.5]]]
    assert top == [[[5, -0.1], [7, -2.5]], [[6, -0.25], [5, -1.5]]]
    assert top == [((5, -0.1), (7, -2.5)), ((6, -0.25), (5, -1.5))]
    assert top != [[[5, -0.1], [7, -2.5]]]
    assert top == TopLogprobs(ids.copy(), lps.copy())
    with pytest.raises(ValueError, match="read-only"):
        top.ids[0, 0] = 1
    with pytest.raises(ValueError, match="shape"):
        TopLogprobs(ids, lps[:1])


def test_check_top_logprobs_public_contract() -> None:
    check_top_logprobs("<engine>", None, [[[5, -0.1]], [[6, -0.2]]], (5, 6), oracle=True)
    with pytest.raises(TraceError, match="not the greedy choice"):
        check_top_logprobs("<engine>", None, [[[5, -0.1], [6, -0.25]]], (6,), oracle=True)
    # Engines hand Python ints of any size: one past float range is an error, not a crash.
    with pytest.raises(TraceError, match="out of range") as info:
        check_top_logprobs("<engine>", None, [[[5, -0.1], [6, -(10**400)]]], (5,), oracle=True)
    assert info.value.field == "top_logprobs[0][1]"


def test_ids_past_int64_take_the_exact_path(tmp_path: Path) -> None:
    big = 2**63  # orjson reads it as an int; numpy's int64 cannot hold it
    lines: list[Any] = good_oracle()
    lines[2]["token_ids"] = [big, 8]
    lines[2]["top_logprobs"] = [[[big, -0.1], [3, -0.2]], filler(8)]
    rec = read_trace(write_lines(tmp_path / "o.jsonl", lines)).records[1]
    assert rec.top_logprobs is not None and rec.top_logprobs[0][0] == [big, -0.1]
    lines[2]["top_logprobs"] = [[[big, -0.1], [big, -0.2]], filler(8)]
    with pytest.raises(TraceError, match="twice"):
        read_trace(write_lines(tmp_path / "o2.jsonl", lines))
