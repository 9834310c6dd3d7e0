"""JSON nested deeper than gate walks or writes is refused as bad input (exit 2), never an
internal error: orjson parses up to 1024 levels, but Python's recursion stops near 1000
and orjson writes at most 254, so a trace field nested 300 or 1000 deep used to end in a
RecursionError or a TypeError (exit 4) in the reader, `gate compare` or `gate merge`."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from helpers.gate_cli import invoke

from gate.core.storage.json_shape import MAX_JSON_DEPTH
from gate.core.traces.reader import read_trace
from gate.errors import TraceError

HEADER = {"gate_trace": 1, "model": "m", "top_k": 1, "engine": {"name": "e", "version": "1"}}
RECORD = {"id": "p", "prompt_token_ids": [1], "token_ids": [2]}


def _deep(levels: int, *, obj: bool = False) -> bytes:
    if obj:
        return b'{"a":' * (levels - 1) + b"{}" + b"}" * (levels - 1)
    return b"[" * levels + b"]" * levels


def _line(value: dict[str, object], field: str | None = None, deep: bytes = b"") -> bytes:
    raw = orjson.dumps(value)
    return (raw[:-1] + b',"' + field.encode() + b'":' + deep + b"}" if field else raw) + b"\n"


def _write(path: Path, role: str, *, header_deep: bytes = b"", record_deep: bytes = b"") -> Path:
    head = {**HEADER, "role": role}
    rec = {**RECORD, "top_logprobs": [[[2, -0.1]]]} if role == "oracle" else dict(RECORD)
    path.write_bytes(
        _line(head, "deep" if header_deep else None, header_deep)
        + _line(rec, "deep" if record_deep else None, record_deep)
    )
    return path


@pytest.mark.parametrize("levels", [300, 1000, 1020])
@pytest.mark.parametrize("where", ["header", "record"])
@pytest.mark.parametrize("obj", [False, True], ids=["lists", "objects"])
def test_a_field_nested_too_deep_is_refused_naming_the_line_and_field(
    tmp_path: Path, levels: int, where: str, obj: bool
) -> None:
    deep = _deep(levels, obj=obj)
    path = _write(tmp_path / "c.jsonl", "candidate", **{f"{where}_deep": deep})  # type: ignore[arg-type]
    with pytest.raises(TraceError) as info:
        read_trace(path)
    err = info.value
    assert err.exit_code == 2 and err.field == "deep" and err.line == (1 if where == "header" else 2)
    assert f"more than {MAX_JSON_DEPTH} levels" in err.problem


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("id", b"DEEP"),
        ("token_ids", b"[DEEP]"),
        ("prompt_token_ids", b"[1,DEEP]"),
        ("top_logprobs", b"[[DEEP]]"),
        ("top_logprobs", b"[[[2,DEEP]]]"),
        ("token_logits", b"[DEEP]"),
        ("tokens", b"[DEEP]"),
    ],
)
def test_a_deep_value_in_a_checked_field_is_refused_without_recursing(tmp_path: Path, field: str, value: bytes) -> None:
    """The fields the reader checks element by element are not walked for depth (the bulk
    of a trace); a deep value there is refused by the check, whose message shows it cut."""
    rec = {"id": "p", "prompt_token_ids": [1], "token_ids": [2], "top_logprobs": [[[2, -0.1]]]}
    raw = orjson.dumps({k: v for k, v in rec.items() if k != field})
    line = raw[:-1] + b',"' + field.encode() + b'":' + value.replace(b"DEEP", _deep(1000)) + b"}\n"
    path = tmp_path / "c.jsonl"
    path.write_bytes(orjson.dumps({**HEADER, "role": "candidate"}) + b"\n" + line)
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert info.value.exit_code == 2 and info.value.line == 2 and len(str(info.value)) < 400
    assert (info.value.field or "").startswith(field)


def test_nesting_within_the_limit_is_kept(tmp_path: Path) -> None:
    # The field itself sits one level down in the line's object.
    path = _write(tmp_path / "c.jsonl", "candidate", record_deep=_deep(MAX_JSON_DEPTH - 1))
    (rec,) = read_trace(path).records
    assert "deep" in rec.extra


@pytest.mark.parametrize("command", ["compare", "merge"])
def test_the_cli_refuses_a_deep_trace_with_one_line(tmp_path: Path, command: str) -> None:
    oracle = _write(tmp_path / "o.jsonl", "oracle")
    cand = _write(tmp_path / "c.jsonl", "candidate", header_deep=_deep(300), record_deep=_deep(1000))
    args = ["compare", str(oracle), str(cand)] if command == "compare" else ["merge", str(cand), "-o", "m.jsonl"]
    r = invoke(args)
    assert r.exit_code == 2, r.output
    assert "internal error" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "c.jsonl:1" in r.stderr and "'deep'" in r.stderr
