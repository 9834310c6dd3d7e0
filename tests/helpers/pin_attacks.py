"""Candidate traces built from the default pin in pure Python (no engine, no torch): honest
copies, and the hostile candidates (a sampler not greedy over its own lists, a
bias confined to late positions or some prompts, less evidence at the flips, malformed
forced lists).

A candidate's own view of a position starts as the oracle's list; `own` transforms it (a
runner-up raised by N evidence units, say), and the candidate takes the top of its own
list (greedy over what it reports) unless `choose` says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from gate.core.traces.reader import read_trace
from gate.core.traces.trace import Trace
from gate.core.verdict.grid import grid_step

PIN = Path(__file__).resolve().parents[2] / "oracle_pins" / "HuggingFaceTB" / "SmolLM2-135M-Instruct" / "pin.jsonl"
FLOOR = 16.0

Own = Callable[[int, dict[str, Any], int, list[list[Any]]], list[list[Any]]]
Choose = Callable[[int, dict[str, Any], int, list[list[Any]]], int | None]


def pin() -> Trace:
    return read_trace(PIN, "oracle")


def pin_without_reference(folder: Path) -> Path:
    """The default pin without its float32 reference (lists, header, `reference_floor`): judged
    by the oracle's floor, as every pin without a reference is. For the attacks on the token
    rules and the drift, whose honest copies are the oracle's lists moved by synthetic noise
    (noise the float32 reference's excess rightly sees as more rounding than the oracle's)."""
    from gate.core.verdict.reference import REFERENCE_HEADER_KEY, REFERENCE_KEY

    lines = PIN.read_bytes().splitlines()
    head = orjson.loads(lines[0])
    head.pop(REFERENCE_HEADER_KEY, None)
    head["doctrine"].pop("reference_floor", None)
    out = [orjson.dumps(head)]
    for line in lines[1:]:
        rec = orjson.loads(line)
        rec.pop(REFERENCE_KEY, None)
        out.append(orjson.dumps(rec))
    path = folder / "pin-without-reference.jsonl"
    path.write_bytes(b"\n".join(out) + b"\n")
    return path


def oracle_dicts() -> list[dict[str, Any]]:
    return [r.to_dict() for r in pin().records]


def unit(rec: dict[str, Any], i: int) -> float:
    """The evidence unit at position i: the bf16 step at max(|top logit|, 16)."""
    return grid_step(max(abs(float(rec["token_logits"][i])), FLOOR), "bfloat16")


def own_step(rec: dict[str, Any], i: int) -> float:
    """The logit's own bf16 grid step at position i (what `near_tie_ulps` counts)."""
    return grid_step(float(rec["token_logits"][i]), "bfloat16")


def gap(rec: dict[str, Any], i: int) -> float:
    """The oracle's top-1 minus top-2 logprob at position i, in nats."""
    t = rec["top_logprobs"][i]
    return float(t[0][1]) - float(t[1][1])


def resort(pairs: Iterable[list[Any]]) -> list[list[Any]]:
    return sorted(([int(t), float(lp)] for t, lp in pairs), key=lambda p: (-p[1], p[0]))


def raise_runner_up(units: float) -> Own:
    """The candidate's list: the oracle's, with its runner-up raised by `units` evidence units."""

    def own(_p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> list[list[Any]]:
        r = int(top[1][0])
        # Never above 0: a logprob is at most 0 (the reader refuses more).
        return resort([t, min(lp + units * unit(rec, i), 0.0) if t == r else lp] for t, lp in top)

    return own


def same(_p: int, _rec: dict[str, Any], _i: int, top: list[list[Any]]) -> list[list[Any]]:
    return [list(pair) for pair in top]


def candidate(
    own: Own = same,
    *,
    choose: Choose | None = None,
    forced: bool = True,
    free_lists: bool = True,
    forced_lists: bool = True,
    only_forced_flips: bool = False,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, records) of a candidate: its own lists from `own`, its choice the top of its
    own list (or `choose`'s token). The free run follows its choices (diverging at its first
    flip); with `forced`, every position is teacher-forced with its own list there. With
    `only_forced_flips`, the free run is the oracle's own (strict) and flips happen only in
    the forced decode."""
    head = {"gate_trace": 1, "role": "candidate", "model": pin().header.model, "top_k": 20}
    head["engine"] = {"name": "hostile", "version": "1"}
    out = []
    for p, rec in enumerate(oracle_dicts()):
        lists, picks = [], []
        for i, top in enumerate(rec["top_logprobs"]):
            mine = own(p, rec, i, top)
            pick = choose(p, rec, i, mine) if choose is not None else None
            lists.append(mine)
            picks.append(int(mine[0][0]) if pick is None else int(pick))
        c: dict[str, Any] = {"id": rec["id"], "prompt_token_ids": rec["prompt_token_ids"]}
        if only_forced_flips:
            c["token_ids"] = list(rec["token_ids"])
            if free_lists:
                c["top_logprobs"] = [[list(x) for x in t] for t in rec["top_logprobs"]]
        else:
            c["token_ids"] = picks
            if free_lists:
                c["top_logprobs"] = lists
        if forced:
            c["forced_token_ids"] = picks
            if forced_lists:
                c["forced_top_logprobs"] = [[list(x) for x in t] for t in lists]
        out.append(c)
    return head, out


def write(path: Path, head: dict[str, Any], records: Iterable[dict[str, Any]]) -> Path:
    with open(path, "wb") as fh:
        fh.write(orjson.dumps(head) + b"\n")
        for r in records:
            fh.write(orjson.dumps(r) + b"\n")
    return path


def ten_flips() -> dict[tuple[int, int], bool]:
    """The first ten oracle positions beyond 125 mnats but within two steps of their logit's grid."""
    out: dict[tuple[int, int], bool] = {}
    for p, rec in enumerate(oracle_dicts()):
        for i in range(len(rec["token_ids"])):
            # Beyond the 125 mnats, within the grid rule's 2 steps of the logit's own grid.
            if 0.125 < gap(rec, i) <= 2 * own_step(rec, i) and len(out) < 10:
                out[(p, i)] = True
    assert len(out) == 10
    return out


def flipped(empty: bool) -> Any:
    """A candidate flipping at exactly `ten_flips()`, its own lists calling each flip a clear
    choice (or, `empty`, no lists at those positions)."""
    flips = ten_flips()

    def own(p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> list[list[Any]]:
        if (p, i) not in flips:
            return [list(x) for x in top]
        (t0, lp0), (t1, _), *rest = top
        # Its own list: the runner-up 5 units ahead of the oracle's token, a clear choice.
        mine = resort([[t0, lp0 - 5 * unit(rec, i)], [t1, lp0], *rest])
        return [] if empty else mine

    def choose(p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> int | None:
        return int(rec["top_logprobs"][i][1][0]) if (p, i) in flips else None

    return candidate(own, choose=choose, only_forced_flips=True)
