"""The record fields that decide verdicts (`token_logits`, the MoE routing, `forced_mode`,
`forced_top_logprobs`) are typed fields of `PromptRecord`: validated once, by the reader
(or where an engine gave them), written back at the same keys in the same order, and read
by no verdict from `extra`, which keeps only the fields nothing decides on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from helpers.pin_attacks import PIN, candidate, raise_runner_up
from helpers.trace_builders import PROMPT, SEED_CANDIDATE, SEED_ORACLE, header

import gate.core.traces.reader as reader_mod
import gate.core.traces.trace as trace_mod
import gate.core.traces.validate as validate_mod
from gate.core.engine import ForcedDecode
from gate.core.traces.reader import read_trace
from gate.core.traces.trace import PromptRecord, TopLogprobs, Trace, encode_trace
from gate.core.verdict.adjudicate import compare
from gate.errors import EngineError, TraceError
from gate.workflows.common.engine_calls import force_along

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "goldens" / "HuggingFaceTB" / "SmolLM2-135M-Instruct" / "hf.jsonl"
MOE = {"layers": [0, 2], "top_k": 1, "num_experts": 4}


def _entries(n: int, expert: int) -> list[list[list[int]]]:
    return [[[expert], [(expert + i) % 4]] for i in range(n)]


def _scores(n: int) -> list[list[list[list[Any]]]]:
    # An integer score (0) stays an integer on the way back.
    return [[[[1, -0.25], [3, -1.5]], [[2, 0], [0, -2.0]]] for _ in range(n)]


def gate_written_record() -> dict[str, Any]:
    """A candidate record with every addition, keys in the order gate's engines and runner
    have always written them: v1's fields, the free run's additions, the engine's other
    fields, then what the forced decode added."""
    n = len(PROMPT) + 2 - 1
    return {
        "id": "p0",
        "prompt_token_ids": list(PROMPT),
        "token_ids": [5, 6],
        "top_logprobs": [[[5, -0.125], [9, -2.5]], [[6, -0.25], [8, -3.0]]],
        "finish_reason": "length",
        "tokens": ["a", "b"],
        "forced_token_ids": [5, 7],
        "token_logits": [12.5, 3],
        "routed_experts": _entries(n, 1),
        "router_top": _scores(n),
        "pick_not_logit_argmax": [],
        "forced_mode": "decode",
        "forced_routed_experts": _entries(n, 2),
        "forced_router_top": _scores(n),
        "forced_top_logprobs": [[[5, -0.125], [9, -2.5]], [[7, -0.25], [6, -0.5]]],
    }


def _write(path: Path, head: dict[str, Any], records: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(x, option=orjson.OPT_APPEND_NEWLINE) for x in [head, *records]))
    return path


def _candidate_file(tmp_path: Path, **changes: Any) -> Path:
    rec = {**gate_written_record(), **changes}
    plain = {"id": "p1", "prompt_token_ids": list(PROMPT), "token_ids": [4], "note": {"any": ["thing"]}}
    return _write(tmp_path / "cand.jsonl", header("candidate", top_k=2, moe=MOE), [rec, plain])


# --------------------------------------------------------------------------- read once, typed


def test_the_reader_fills_the_typed_fields_and_extra_keeps_only_unknown_keys(tmp_path: Path) -> None:
    rec, plain = read_trace(_candidate_file(tmp_path)).records
    assert rec.token_logits == [12.5, 3]
    assert rec.forced_mode == "decode"
    assert isinstance(rec.forced_top_logprobs, TopLogprobs)  # validated, kept as arrays
    assert rec.forced_top_logprobs[1] == [[7, -0.25], [6, -0.5]]
    assert rec.routed_experts == _entries(4, 1) and rec.forced_routed_experts == _entries(4, 2)
    assert rec.router_top == _scores(4) and rec.forced_router_top == _scores(4)
    assert rec.extra == {"pick_not_logit_argmax": []}
    assert plain.extra == {"note": {"any": ["thing"]}}
    assert plain.token_logits is plain.forced_mode is plain.forced_top_logprobs is plain.routed_experts is None


def test_a_trace_gate_writes_reads_and_writes_back_byte_for_byte(tmp_path: Path) -> None:
    path = _candidate_file(tmp_path)
    trace = read_trace(path)
    assert encode_trace(trace.header, trace.records) == path.read_bytes()


def _canonical(path: Path) -> bytes:
    """The file as gate writes it: the same keys in the same order, compact JSON."""
    lines = [line for line in path.read_bytes().splitlines() if line.strip()]
    return b"".join(orjson.dumps(orjson.loads(line), option=orjson.OPT_APPEND_NEWLINE) for line in lines)


@pytest.mark.parametrize("path", [PIN, GOLDEN, SEED_ORACLE, SEED_CANDIDATE], ids=["pin", "golden", "seed-o", "seed-c"])
def test_committed_traces_write_back_as_read(path: Path) -> None:
    trace = read_trace(path)
    out = encode_trace(trace.header, trace.records)
    assert out == _canonical(path)
    if path in (PIN, GOLDEN):  # written by gate: byte for byte
        assert out == path.read_bytes()


def test_the_committed_pin_carries_its_logits_in_the_typed_field() -> None:
    records = read_trace(PIN).records
    assert all(r.token_logits is not None and len(r.token_logits) == len(r.token_ids) for r in records)
    assert all("token_logits" not in r.extra for r in records)


@pytest.mark.parametrize(
    ("changes", "field", "needle"),
    [
        (
            {"forced_top_logprobs": [[[5, -0.125], [9, -2.5]], [[6, -0.5], [7, -0.25]]]},
            "forced_top_logprobs[1][1]",
            "out of order",
        ),
        ({"forced_top_logprobs": [[[5, -0.125]]]}, "forced_top_logprobs", "has 1 positions for 2"),
        ({"forced_token_ids": None}, "forced_top_logprobs", "needs forced_token_ids"),
        ({"forced_mode": "sideways"}, "forced_mode", "must be 'decode' or 'prefill'"),
        ({"forced_mode": 1}, "forced_mode", "must be 'decode' or 'prefill'"),
        ({"token_logits": [12.5]}, "token_logits", "has 1 logits for 2"),
        ({"forced_router_top": [[]]}, "forced_router_top", "has 1 entries"),
    ],
    ids=["unsorted", "short", "no forced ids", "mode", "mode type", "logits", "routing"],
)
def test_a_malformed_addition_is_refused_when_read(
    tmp_path: Path, changes: dict[str, Any], field: str, needle: str
) -> None:
    with pytest.raises(TraceError) as info:
        read_trace(_candidate_file(tmp_path, **changes))
    assert info.value.line == 2 and info.value.field == field, info.value
    assert needle in info.value.problem, info.value


def test_a_verdict_does_not_validate_the_lists_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read once; compare (with forced flips at many positions) then trusts the records."""
    from helpers.pin_attacks import write

    oracle = read_trace(PIN, role="oracle")
    cand = read_trace(write(tmp_path / "cand.jsonl", *candidate(raise_runner_up(2.5))), role="candidate")
    # The same lists as plain lists (as an engine gives them), which no shortcut could skip.
    plain = tuple(
        replace(r, forced_top_logprobs=[[list(p) for p in pos] for pos in r.forced_top_logprobs])
        if r.forced_top_logprobs is not None
        else r
        for r in cand.records
    )
    cand = replace(cand, records=plain)
    assert any(r.forced_top_logprobs is not None for r in cand.records)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("validated again")

    for module in (reader_mod, validate_mod):
        monkeypatch.setattr(module, "check_top_logprobs", refuse)
        monkeypatch.setattr(module, "check_forced_top", refuse)
    result = compare(oracle, cand)
    assert sum(d.source == "forced" for d in result.divergences) > len(cand.records)


# --------------------------------------------------------------------------- the constructor's rule


def test_extra_keys_that_name_a_typed_field_are_moved_into_it() -> None:
    """A plugin that still passes `extra={"token_logits": ...}` makes the same record."""
    old = PromptRecord("p", (1,), (2,), extra={"token_logits": [9.5], "forced_mode": "prefill", "own": 1})
    new = PromptRecord("p", (1,), (2,), extra={"own": 1}, token_logits=[9.5], forced_mode="prefill")
    assert old == new and old.extra == {"own": 1} and old.token_logits == [9.5]
    assert old.to_dict() == new.to_dict()
    # `replace` takes the same road: the key lands in the field, not in extra.
    moved = replace(new, extra={**new.extra, "forced_top_logprobs": [[[2, -0.5]]]})
    assert moved.forced_top_logprobs == [[[2, -0.5]]] and moved.extra == {"own": 1}
    with pytest.raises(ValueError, match="token_logits given twice"):
        PromptRecord("p", (1,), (2,), extra={"token_logits": [1.0]}, token_logits=[1.0])


def test_a_record_writes_its_additions_in_gates_order() -> None:
    rec = gate_written_record()
    built = PromptRecord(
        id="p0",
        prompt_token_ids=PROMPT,
        token_ids=(5, 6),
        top_logprobs=rec["top_logprobs"],
        finish_reason="length",
        tokens=("a", "b"),
        forced_token_ids=(5, 7),
        # a plugin's keyword order, and its own field given first: the output order is gate's
        forced_top_logprobs=rec["forced_top_logprobs"],
        extra={"pick_not_logit_argmax": []},
        forced_router_top=rec["forced_router_top"],
        forced_routed_experts=rec["forced_routed_experts"],
        forced_mode="decode",
        router_top=rec["router_top"],
        routed_experts=rec["routed_experts"],
        token_logits=rec["token_logits"],
    )
    assert orjson.dumps(built.to_dict()) == orjson.dumps(rec)


# --------------------------------------------------------------------------- the engine boundary


class _Forcer:
    """An engine whose forced lists break the format (a fault a real engine cannot show)."""

    name = "forcer"

    def __init__(self, tops: list[list[list[Any]]], mode: str = "decode") -> None:
        self.tops, self.mode = tops, mode

    def force(self, prompt_token_ids: Any, token_ids: Any, top_k: int) -> ForcedDecode:
        return ForcedDecode(token_ids=tuple(token_ids), top_logprobs=self.tops, mode=self.mode)


def _traces() -> tuple[Trace, Trace]:
    orc = PromptRecord("p0", PROMPT, (5, 6), top_logprobs=[[[5, -0.125]], [[6, -0.25]]])
    free = PromptRecord("p0", PROMPT, (5, 7), top_logprobs=[[[5, -0.125]], [[7, -0.25]]])
    oracle = Trace(trace_mod.TraceHeader("oracle", "m", 2, {}), (orc,))
    return oracle, Trace(trace_mod.TraceHeader("candidate", "m", 2, {}), (free,))


def test_an_engines_forced_lists_are_checked_once_where_it_gave_them() -> None:
    oracle, free = _traces()
    good = [[[5, -0.125], [6, -2.0]], [[6, -0.25], [7, -0.5]]]
    forced, ids = force_along(_Forcer(good), oracle, free, top_k=2)
    (rec,) = forced.records
    assert ids == ("p0",) and rec.forced_mode == "decode" and rec.forced_top_logprobs == good
    assert rec.extra == {}
    bad = [[[5, -0.125], [6, -2.0]], [[7, -0.5], [6, -0.25]]]
    with pytest.raises(EngineError, match=r"prompt 'p0': invalid forced top logprobs: out of order"):
        force_along(_Forcer(bad), oracle, free, top_k=2)
    with pytest.raises(EngineError, match=r"force returned mode 'sideways'"):
        force_along(_Forcer(good, mode="sideways"), oracle, free, top_k=2)
