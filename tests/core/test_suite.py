"""Prompt suites: parsing, one clear error per bad line, and the hash pinned with them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gate.core.pins.suite import Suite, SuitePrompt, parse_suite, read_suite
from gate.errors import InputError

GOOD: list[dict[str, Any]] = [
    {"id": "code", "text": "import numpy as np", "max_tokens": 32},
    {"id": "chat", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]},
]


def _jsonl(rows: Sequence[object]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_reads_text_and_chat_prompts(tmp_path: Path) -> None:
    path = tmp_path / "suite.jsonl"
    path.write_bytes(_jsonl(GOOD))
    suite = read_suite(path)
    assert suite.ids == ("code", "chat")
    code, chat = suite.prompts
    assert (code.text, code.max_tokens, code.line) == ("import numpy as np", 32, 1)
    assert chat.messages == (("system", "Be brief."), ("user", "2+2?"))
    assert chat.max_tokens is None and chat.is_chat and chat.display == "2+2?"
    assert chat.messages_dicts() == GOOD[1]["messages"]


def test_resolved_fills_max_tokens_and_override_wins() -> None:
    suite = parse_suite(_jsonl(GOOD))
    assert [p.max_tokens for p in suite.resolved(16)] == [32, 16]
    assert [p.max_tokens for p in suite.resolved(16, override=8)] == [8, 8]
    with pytest.raises(InputError, match=r"<suite>:2: field 'max_tokens': missing for prompt 'chat'"):
        suite.resolved(None)


def test_hash_ignores_formatting_but_not_content() -> None:
    base = parse_suite(_jsonl(GOOD)).resolved(32)
    reformatted = b"\n\n" + b"\n".join(
        json.dumps(dict(reversed(list(r.items()))), indent=None, separators=(" ,", " : ")).encode() for r in GOOD
    )
    assert parse_suite(reformatted).resolved(32).sha256 == base.sha256
    changed = [dict(GOOD[0], text="import numpy as np "), GOOD[1]]
    assert parse_suite(_jsonl(changed)).resolved(32).sha256 != base.sha256
    longer = [dict(GOOD[0], max_tokens=33), GOOD[1]]
    assert parse_suite(_jsonl(longer)).resolved(32).sha256 != base.sha256
    # Each prompt's own hash moves only with that prompt.
    a = parse_suite(_jsonl(changed)).resolved(32).prompt_hashes()
    b = base.prompt_hashes()
    assert a["code"] != b["code"] and a["chat"] == b["chat"]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"id": "a", "text": "x"'], r"suite.jsonl:1: bad JSON"),
        (
            ['{"id": "a", "text": "x"}', '{"id": "b", "text": "y"}', '{"id": "a", "text": "z"}'],
            r"suite.jsonl:3: field 'id': duplicate id 'a' \(first on line 1\)",
        ),
        (['{"id": "a", "text": ""}'], r"suite.jsonl:1: field 'text': prompt 'a' is empty"),
        (['{"id": "a", "text": "   \\n"}'], r"suite.jsonl:1: field 'text': prompt 'a' is empty"),
        (['{"id": "a", "text": 5}'], r"suite.jsonl:1: field 'text': must be a string"),
        (['{"id": "a"}'], r"suite.jsonl:1: field 'text': prompt 'a' has neither of 'text' and 'messages'"),
        (['{"id": "a", "text": "x", "messages": []}'], r"has both of 'text' and 'messages'"),
        (['{"text": "x"}'], r"suite.jsonl:1: field 'id': missing"),
        (['{"id": "", "text": "x"}'], r"suite.jsonl:1: field 'id': must be a non-empty string"),
        (['{"id": 7, "text": "x"}'], r"suite.jsonl:1: field 'id': must be a non-empty string, found 7"),
        (
            ['{"id": "a", "text": "x", "max_tokens": 0}'],
            r"suite.jsonl:1: field 'max_tokens': must be an integer from 1",
        ),
        (
            ['{"id": "a", "text": "x", "max_tokens": "32"}'],
            r"field 'max_tokens': must be an integer from 1 to 65536, found '32'",
        ),
        (['{"id": "a", "text": "x", "max_tokens": 1.5}'], r"field 'max_tokens'"),
        (['{"id": "a", "text": "x", "max_tokens": true}'], r"field 'max_tokens'"),
        (['{"id": "a", "text": "x", "max_tokens": 1000000}'], r"field 'max_tokens'"),
        (['{"id": "a", "text": "x", "maxtokens": 3}'], r"suite.jsonl:1: field 'maxtokens': unknown field"),
        (['["a", "x"]'], r"suite.jsonl:1: a prompt must be a JSON object"),
        (['{"id": "a", "messages": []}'], r"field 'messages': prompt 'a': must be a non-empty list"),
        (
            ['{"id": "a", "messages": [{"role": "robot", "content": "x"}]}'],
            r"field 'messages\[0\].role': must be one of",
        ),
        (
            ['{"id": "a", "messages": [{"role": "user", "content": ""}]}'],
            r"field 'messages\[0\].content': prompt 'a': empty",
        ),
        (['{"id": "a", "messages": [{"role": "user"}]}'], r"field 'messages\[0\]': must be an object with exactly"),
        (['{"id": "a", "messages": [{"role": "system", "content": "x"}]}'], r"needs at least one 'user' message"),
        (["", "  "], r"suite.jsonl: the prompt suite is empty"),
    ],
)
def test_bad_suites_name_file_line_and_field(tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "suite.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=message) as info:
        read_suite(path)
    assert str(path) in str(info.value)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such prompt suite file"):
        read_suite(tmp_path / "nope.jsonl")
    with pytest.raises(InputError, match="is a directory"):
        read_suite(tmp_path)


_text = st.text(min_size=1, max_size=30).filter(lambda s: s.strip() != "")


@st.composite
def _prompts(draw: st.DrawFn) -> Suite:
    n = draw(st.integers(1, 6))
    out = []
    for i in range(n):
        if draw(st.booleans()):
            p = SuitePrompt(id=f"p{i}", text=draw(_text), max_tokens=draw(st.integers(1, 64)))
        else:
            p = SuitePrompt(id=f"p{i}", messages=(("user", draw(_text)),), max_tokens=draw(st.integers(1, 64)))
        out.append(p)
    return Suite(prompts=tuple(out))


@given(_prompts())
def test_encode_parse_round_trip_keeps_prompts_and_hash(suite: Suite) -> None:
    again = parse_suite(suite.encode())
    assert again.same_prompts(suite)
    assert again.sha256 == suite.sha256
