"""Evidence-reducing transformations of a candidate trace, for the monotonicity properties:
each removes, truncates or replaces something the candidate reports about itself (list
entries, whole lists, forced ids and lists, `token_logits`, the header's `top_k`, header
fields, the tail of a free run), or puts one field's values in another's place (forced
lists := free-run lists and back, header `top_k` := its shortest list). Pure: Trace objects
in, Trace objects out."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from gate.core.traces.trace import PromptRecord, Trace

FREE, FORCED = "free", "forced"


def _lists(rec: PromptRecord, part: str) -> list[list[list[Any]]] | None:
    raw = rec.top_logprobs if part == FREE else rec.forced_top_logprobs
    return None if raw is None else [[[int(t), float(lp)] for t, lp in pos] for pos in raw]


def _with_lists(rec: PromptRecord, part: str, tops: list[list[list[Any]]] | None) -> PromptRecord:
    if part == FREE:
        return replace(rec, top_logprobs=tops)
    return replace(rec, forced_top_logprobs=tops)


def _records(trace: Trace, rng: random.Random, change: Callable[[PromptRecord], PromptRecord]) -> Trace:
    recs = list(trace.records)
    k = rng.randrange(len(recs))
    recs[k] = change(recs[k])
    return replace(trace, records=tuple(recs))


def _pick_list(trace: Trace, rng: random.Random) -> tuple[int, str, int, list[list[list[Any]]]] | None:
    """One non-empty list (free run or forced) chosen at random: (record index, part,
    position, that part's lists), or None where the trace holds none."""
    spots = [
        (k, part, i)
        for k, rec in enumerate(trace.records)
        for part in (FREE, FORCED)
        for i, pos in enumerate(_lists(rec, part) or ())
        if len(pos)
    ]
    if not spots:
        return None
    k, part, i = rng.choice(spots)
    tops = _lists(trace.records[k], part)
    assert tops is not None
    return k, part, i, tops


def _with_one_list(trace: Trace, k: int, part: str, tops: list[list[list[Any]]]) -> Trace:
    recs = list(trace.records)
    recs[k] = _with_lists(recs[k], part, tops)
    return replace(trace, records=tuple(recs))


def _one_list(
    trace: Trace, rng: random.Random, edit: Callable[[list[list[Any]], random.Random], list[list[Any]]]
) -> Trace:
    """Apply `edit` to one non-empty list (free run or forced) chosen at random."""
    picked = _pick_list(trace, rng)
    if picked is None:
        return trace
    k, part, i, tops = picked
    tops[i] = edit(tops[i], rng)
    return _with_one_list(trace, k, part, tops)


def truncate(trace: Trace, oracle: Trace, rng: random.Random) -> Trace:
    return _one_list(trace, rng, lambda pos, r: pos[: r.randrange(len(pos))])


def drop_entry(trace: Trace, oracle: Trace, rng: random.Random) -> Trace:
    def edit(pos: list[list[Any]], r: random.Random) -> list[list[Any]]:
        j = r.randrange(len(pos))
        return pos[:j] + pos[j + 1 :]

    return _one_list(trace, rng, edit)


def empty_list(trace: Trace, oracle: Trace, rng: random.Random) -> Trace:
    return _one_list(trace, rng, lambda pos, r: [])


def empty_worst(trace: Trace, oracle: Trace, rng: random.Random) -> Trace:
    """Empty the lists of a whole run of positions (the candidate choosing where to be silent)."""
    part = rng.choice((FREE, FORCED))
    lo = rng.randrange(40)
    hi = lo + rng.randrange(1, 40)

    def change(rec: PromptRecord) -> PromptRecord:
        tops = _lists(rec, part)
        if tops is None:
            return rec
        return _with_lists(rec, part, [[] if lo <= i < hi else pos for i, pos in enumerate(tops)])

    return replace(trace, records=tuple(change(r) for r in trace.records))


def replace_unlisted(trace: Trace, oracle: Trace, rng: random.Random) -> Trace:
    """An entry's token replaced by one neither list holds, at the same logprob."""
    by_id = oracle.by_id()
    picked = _pick_list(trace, rng)
    if picked is None:
        return trace
    k, part, i, tops = picked
    otop = by_id[trace.records[k].id].top_logprobs
    taken = {int(t) for t, _ in tops[i]} | (
        {int(t) for t, _ in otop[i]} if otop is not None and i < len(otop) else set()
    )
    new = max(taken | {0}) + 1 + rng.randrange(1000)
    j = rng.randrange(len(tops[i]))
    pos = [list(p) for p in tops[i]]
    pos[j] = [new, pos[j][1]]
    pos.sort(key=lambda p: (-p[1], p[0]))
    tops[i] = pos
    return _with_one_list(trace, k, part, tops)


def drop_lists(trace: Trace, oracle: Trace, rng: random.Random) -> Trace:
    part = rng.choice((FREE, FORCED))
    return _records(trace, rng, lambda rec: _with_lists(rec, part, None))


def drop_all_lists(trace: Trace, oracle: Trace, rng: random.Random) -> Trace:
    recs = tuple(_with_lists(_with_lists(r, FREE, None), FORCED, None) for r in trace.records)
    return replace(trace, records=recs)


def drop_forced(trace: Trace, oracle: Trace, rng: random.Random) -> Trace:
    def change(rec: PromptRecord) -> PromptRecord:
        return replace(
            rec,
            forced_token_ids=None,
            forced_mode=None,
            forced_top_logprobs=None,
            forced_routed_experts=None,
            forced_router_top=None,
        )

    return _records(trace, rng, change)


def drop_forced_lists(trace: Trace, oracle: Trace, rng: random.Random) -> Trace:
    return _records(trace, rng, lambda rec: _with_lists(rec, FORCED, None))


def drop_token_logits(trace: Trace, oracle: Trace, rng: random.Random) -> Trace:
    recs = tuple(replace(r, token_logits=None) for r in trace.records)
    return replace(trace, records=recs)


def lower_top_k(trace: Trace, oracle: Trace, rng: random.Random) -> Trace:
    head = trace.header
    return replace(trace, header=replace(head, top_k=rng.randrange(max(head.top_k, 1))))


def drop_header_fields(trace: Trace, oracle: Trace, rng: random.Random) -> Trace:
    head = trace.header
    return replace(trace, header=replace(head, extra={}, engine={}))


def cut_free_run(trace: Trace, oracle: Trace, rng: random.Random) -> Trace:
    """The free run's tail dropped (tokens and lists): whole positions withheld."""

    def change(rec: PromptRecord) -> PromptRecord:
        m = rng.randrange(len(rec.token_ids)) if rec.token_ids else 0
        top = _lists(rec, FREE)
        return replace(rec, token_ids=rec.token_ids[:m], top_logprobs=None if top is None else top[:m])

    return _records(trace, rng, change)


def forced_from_free(trace: Trace, oracle: Trace, rng: random.Random) -> Trace:
    """A forced prompt's lists replaced by its free run's, position by position (where the
    free run has one): one field's values put in another's place."""
    return _records(trace, rng, lambda rec: _lists_from(rec, FREE, FORCED))


def free_from_forced(trace: Trace, oracle: Trace, rng: random.Random) -> Trace:
    """A free run's lists replaced by its forced decode's (the lists the teacher-forced pass
    saw), position by position."""
    return _records(trace, rng, lambda rec: _lists_from(rec, FORCED, FREE))


def _lists_from(rec: PromptRecord, source: str, target: str) -> PromptRecord:
    """`rec` with `target`'s lists replaced by `source`'s, position by position (where
    `source` has one)."""
    given, kept = _lists(rec, source), _lists(rec, target)
    if given is None or kept is None:
        return rec
    return _with_lists(rec, target, [given[i] if i < len(given) else pos for i, pos in enumerate(kept)])


def top_k_from_lists(trace: Trace, oracle: Trace, rng: random.Random) -> Trace:
    """The header's `top_k` replaced by the length of the candidate's shortest non-empty list."""
    lengths = [len(pos) for rec in trace.records for part in (FREE, FORCED) for pos in _lists(rec, part) or () if pos]
    return replace(trace, header=replace(trace.header, top_k=min(lengths, default=0)))


CUTS: dict[str, Callable[[Trace, Trace, random.Random], Trace]] = {
    "truncate": truncate,
    "drop_entry": drop_entry,
    "empty_list": empty_list,
    "empty_worst": empty_worst,
    "replace_unlisted": replace_unlisted,
    "drop_lists": drop_lists,
    "drop_all_lists": drop_all_lists,
    "drop_forced": drop_forced,
    "drop_forced_lists": drop_forced_lists,
    "drop_token_logits": drop_token_logits,
    "lower_top_k": lower_top_k,
    "drop_header_fields": drop_header_fields,
    "cut_free_run": cut_free_run,
    "forced_from_free": forced_from_free,
    "free_from_forced": free_from_forced,
    "top_k_from_lists": top_k_from_lists,
}


def apply_cuts(trace: Trace, oracle: Trace, cuts: Sequence[tuple[str, int]]) -> Trace:
    for name, seed in cuts:
        trace = CUTS[name](trace, oracle, random.Random(seed))
    return trace
