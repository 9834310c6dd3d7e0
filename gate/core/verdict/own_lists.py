"""The candidate's own lists, checked before they are believed: each record's free-run and
forced lists (validated once, by the trace reader or where the engine gave them; here
matched to the oracle's positions), whether each part carries lists at all, and every
position where the candidate's choice is not a maximum of its own list within one float32
rounding (`NotGreedy`).

Pure functions over token ids and logprobs (no I/O, no torch), used by the adjudication.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gate.core.traces.trace import FORCED_TOP_KEY, PromptRecord, Trace
from gate.core.verdict.grid import MAX_GRID_LOGIT, logprob_slack
from gate.errors import InputError

FREE_RUN = "free_run"  # the values of `Divergence.source` (gate.core.verdict.result)
FORCED = "forced"


@dataclass(frozen=True, slots=True)
class NotGreedy:
    """A position where the candidate's choice is not a maximum of its own reported list."""

    prompt_id: str
    position: int
    source: str  # FREE_RUN or FORCED
    chosen: int
    chosen_logprob: float | None  # None: its own list does not hold the token it chose
    best_token: int
    best_logprob: float

    @property
    def behind_mnats(self) -> float | None:
        return None if self.chosen_logprob is None else 1000.0 * (self.best_logprob - self.chosen_logprob)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_id": self.prompt_id,
            "position": self.position,
            "source": self.source,
            "chosen": self.chosen,
            "chosen_logprob": self.chosen_logprob,
            "best_token": self.best_token,
            "best_logprob": self.best_logprob,
            "behind_mnats": self.behind_mnats,
        }


@dataclass(frozen=True, slots=True)
class OwnLists:
    """A candidate record's own top-k lists: its free run's and its forced decode's (each
    validated once per record), None where it has none."""

    free: Sequence[Sequence[Sequence[Any]]] | None
    forced: Sequence[Sequence[Sequence[Any]]] | None

    def at(self, source: str, position: int) -> Sequence[Sequence[Any]] | None:
        tops = self.forced if source == FORCED else self.free
        if tops is None or position >= len(tops):
            return None
        pos = tops[position]
        return pos if len(pos) else None


@dataclass(frozen=True, slots=True)
class CandidateEvidence:
    """What a candidate trace says about itself, checked once: its lists per record, whether
    each part (free run, forced) carries lists at all, and where it is not greedy."""

    lists: Mapping[str, OwnLists]
    free_has_lists: bool
    forced_has_lists: bool
    not_greedy: tuple[NotGreedy, ...] = ()
    # Records beyond those kept in `not_greedy` (a report shows a few, counts all).
    not_greedy_total: int = 0
    by_prompt: Mapping[str, int] = field(default_factory=dict)

    def has_lists(self, source: str) -> bool:
        return self.forced_has_lists if source == FORCED else self.free_has_lists

    def own(self, prompt_id: str) -> OwnLists:
        return self.lists.get(prompt_id, _NO_LISTS)


_NO_LISTS = OwnLists(None, None)
# How many not-greedy positions a result keeps (each listed in the JSON report); all are counted.
NOT_GREEDY_KEPT = 200


def forced_tops(rec: PromptRecord, n: int, path: str = "candidate") -> Sequence[Sequence[Sequence[Any]]] | None:
    """The record's `forced_top_logprobs` (validated when read, or where the engine gave
    them), checked to hold one list per oracle position; None where it has none."""
    tops = rec.forced_top_logprobs
    if tops is None:
        return None
    if len(tops) != n:
        raise InputError(
            f"{path}: prompt {rec.id!r}: field {FORCED_TOP_KEY!r}: expected one top-k list per oracle position "
            f"({n}), found {len(tops)}"
        )
    return tops


def free_tops(rec: PromptRecord) -> Sequence[Sequence[Sequence[Any]]] | None:
    top = rec.top_logprobs
    return top if top is not None and len(top) else None


def _any_list(tops: Sequence[Sequence[Sequence[Any]]] | None) -> bool:
    if tops is None:
        return False
    shape = getattr(tops, "ids", None)
    if shape is not None:
        return bool(shape.shape[0] and shape.shape[1])
    return any(len(p) for p in tops)


def greedy_breaks(
    prompt_id: str, source: str, tops: Sequence[Sequence[Sequence[Any]]] | None, chosen: Sequence[int]
) -> Iterator[NotGreedy]:
    """Positions where `chosen[i]` is not a maximum of the list `tops[i]` within one float32
    rounding (among equal maxima any choice is a tie-break, not a contradiction). A list
    that does not hold the chosen token puts it below every listed one: not greedy."""
    if tops is None:
        return
    ids = getattr(tops, "ids", None)
    # The reader's arrays: one vectorised pass (ids past int64 take the loop below).
    if ids is not None and all(0 <= int(t) < 2**63 for t in chosen):
        yield from _greedy_breaks_arrays(prompt_id, source, tops, chosen)
        return
    for i in range(min(len(tops), len(chosen))):
        pos = tops[i]
        if not len(pos):
            continue
        best_t, best_lp = int(pos[0][0]), float(pos[0][1])
        for t, lp in pos:
            if float(lp) > best_lp:
                best_t, best_lp = int(t), float(lp)
        c = int(chosen[i])
        c_lp = next((float(lp) for t, lp in pos if int(t) == c), None)
        if c_lp is None or best_lp - c_lp > logprob_slack(best_lp, c_lp):
            yield NotGreedy(prompt_id, i, source, c, c_lp, best_t, best_lp)


def _greedy_breaks_arrays(prompt_id: str, source: str, tops: Any, chosen: Sequence[int]) -> Iterator[NotGreedy]:
    n = min(len(tops), len(chosen))
    if n == 0 or tops.ids.shape[1] == 0:
        return
    ids, lps = tops.ids[:n], tops.logprobs[:n]
    want = np.asarray(chosen[:n], dtype=np.int64)[:, None]
    hit = ids == want
    has = hit.any(axis=1)
    c_lp = np.where(has, np.where(hit, lps, -np.inf).max(axis=1), -np.inf)
    best = lps.max(axis=1)
    # One float32 step at the larger magnitude (logprob_slack), vectorised, and capped as it
    # is: a magnitude of MAX_GRID_LOGIT or more takes the step of [64, 128).
    mag = np.maximum(np.abs(best), np.abs(np.where(has, c_lp, best)))
    mag = np.where(mag >= MAX_GRID_LOGIT, 64.0, mag)
    _, exp = np.frexp(mag)
    slack = np.where(mag == 0.0, 2.0**-149, np.ldexp(1.0, np.maximum(exp - 1, -126) - 23))
    bad = ~has | (best - c_lp > slack)
    for i in np.flatnonzero(bad).tolist():
        j = int(lps[i].argmax())
        yield NotGreedy(
            prompt_id,
            i,
            source,
            int(chosen[i]),
            float(c_lp[i]) if has[i] else None,
            int(ids[i, j]),
            float(best[i]),
        )


def candidate_evidence(oracle: Trace, candidate: Trace) -> CandidateEvidence:
    """Check a candidate trace's own lists once (forced lists matched to the oracle's
    positions, greedy over its own lists at every position), prompts matched by id."""
    n_of = {r.id: len(r.token_ids) for r in oracle.records}
    tokens_of = {r.id: r.token_ids for r in oracle.records}
    lists: dict[str, OwnLists] = {}
    breaks: list[NotGreedy] = []
    total = 0
    per: dict[str, int] = {}
    free_any = forced_any = False
    for rec in candidate.records:
        n = n_of.get(rec.id, len(rec.forced_token_ids or ()))
        free = free_tops(rec)
        forced = forced_tops(rec, n, candidate.path) if rec.forced_token_ids is not None else None
        lists[rec.id] = OwnLists(free, forced)
        free_any = free_any or _any_list(free)
        forced_any = forced_any or _any_list(forced)
        # Its free run counts up to and including its first divergence: the positions that
        # share the oracle's context, where a pin with a floor asks for its lists. A break past
        # them is on a context of its own, whose lists it may drop without being asked, and a
        # penalty it can shed by saying less would make less evidence a laxer verdict.
        shared = _shared_prefix(tokens_of.get(rec.id), rec.token_ids)
        for part, tops, chosen in ((FREE_RUN, free, shared), (FORCED, forced, rec.forced_token_ids or ())):
            for b in greedy_breaks(rec.id, part, tops, chosen):
                total += 1
                per[rec.id] = per.get(rec.id, 0) + 1
                if len(breaks) < NOT_GREEDY_KEPT:
                    breaks.append(b)
    return CandidateEvidence(lists, free_any, forced_any, tuple(breaks), total, per)


def _shared_prefix(oracle_tokens: Sequence[int] | None, chosen: Sequence[int]) -> Sequence[int]:
    """The candidate's free-run tokens up to and including its first divergence from the
    oracle's (all of them where it does not diverge, or the oracle is unknown)."""
    if oracle_tokens is None:
        return chosen
    n = min(len(oracle_tokens), len(chosen))
    first = next((i for i in range(n) if chosen[i] != oracle_tokens[i]), None)
    return chosen[: first + 1] if first is not None else chosen[:n]
