"""The checks of a trace's top-k lists and evidence fields (trace v1, docs/spec.md): the
bulk of a trace is validated vectorised with numpy; any list the fast path cannot vouch for
is re-checked position by position, which is also what produces the precise error message.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

from gate.core.storage.json_shape import shown
from gate.core.traces.trace import FORCED_MODES, FORCED_TOP_KEY, TopList, TopLogprobs, TraceHeader
from gate.errors import TraceError

# Exact type sets for the fast checks (bool is not int here).
LIST_ONLY = frozenset({list})
STR_ONLY = frozenset({str})
INT_ONLY = frozenset({int})
NUM_ONLY = frozenset({int, float})
_MAX_FLOAT_INT = int(1.7976931348623157e308)
# `token_logits` (beyond v1: the chosen token's raw logit per position) fixes the size of a
# grid step for the ULP doctrine, so a tampered one could widen a step at will. No trained
# model's logits come near this magnitude (top logits sit at 10-60; GPT-2's most negative
# at about -150); a larger one is refused. The step itself is capped lower, in adjudicate.
MAX_ABS_LOGIT = 1024.0
# A top-k list is part of one softmax: its probabilities add up to at most 1 (float32
# rounding: the default pin's lists reach 1.00000003). The spec's own seed example
# (docs/examples/seed-oracle.jsonl) reaches 5.4, so the hard limit sits above it:
# it refuses lists that claim many near-certain tokens at once (twenty at -1e-4 add up to
# 20), which would make any choice among them a "tie".
MAX_TOP_MASS = 8.0


def is_int(v: Any) -> bool:
    return type(v) is int


def is_num(v: Any) -> bool:
    return type(v) is float or type(v) is int


def check_forced_top(
    name: str,
    lineno: int | None,
    value: Any,
    forced_ids: Sequence[int] | None,
    header: TraceHeader,
    oracle: bool,
    *,
    where: str = "",
) -> Sequence[TopList]:
    """`forced_top_logprobs`: the candidate's own top-k at each teacher-forced position,
    checked exactly as `top_logprobs` is (logprob <= 0 and finite, sorted, no repeated id,
    integer ids, within the header's top_k plus the chosen token), and only beside the
    `forced_token_ids` it describes. Once per record, in linear time."""
    fld = where + FORCED_TOP_KEY
    if oracle:
        raise TraceError(name, lineno, fld, "is for candidate traces only")
    if forced_ids is None:
        why = "needs forced_token_ids in the same record (forced lists without a forced decode to describe)"
        raise TraceError(name, lineno, fld, why)
    if header.top_k == 0:
        why = "the header's top_k is 0 (no logprobs), but this record carries forced top-k lists"
        raise TraceError(name, lineno, fld, why)
    compact = isinstance(value, TopLogprobs) and len(value) == len(forced_ids)
    if compact and value.ids.shape[1] <= header.top_k + 1:
        return value  # the reader's own arrays: validated when made
    return check_top_logprobs(name, lineno, value, forced_ids, oracle=False, fld=fld, top_k=header.top_k)


def check_forced_mode(name: str, lineno: int, value: Any, forced_ids: Sequence[int] | None) -> None:
    """`forced_mode`: which path gave the forced data, `"decode"` or `"prefill"` (null: none),
    and only beside the `forced_token_ids` it describes."""
    if value is None:
        return
    if value not in FORCED_MODES or type(value) is not str:
        why = f"must be 'decode' or 'prefill' (the path that gave the forced data), found {shown(value)}"
        raise TraceError(name, lineno, "forced_mode", why)
    if forced_ids is None:
        why = "needs forced_token_ids in the same record (a forced mode without a forced decode to describe)"
        raise TraceError(name, lineno, "forced_mode", why)


def check_token_logits(name: str, lineno: int, value: Any, token_ids: Sequence[int]) -> None:
    """`token_logits`: one finite, plausible number per generated token.

    With the position's logprob lp it implies the log-normaliser Z = logit - lp, which is
    >= the logit because lp <= 0 (checked with the lists); what remains to check is the
    logit itself: a number, finite, and |logit| <= MAX_ABS_LOGIT.
    """
    fld = "token_logits"
    if not isinstance(value, list):
        found = type(value).__name__
        raise TraceError(name, lineno, fld, f"must be a list of numbers (one logit per token), found {found}")
    if len(value) != len(token_ids):
        raise TraceError(name, lineno, fld, f"has {len(value)} logits for {len(token_ids)} generated tokens")
    if not value:
        return
    if set(map(type, value)) <= NUM_ONLY:
        try:
            if max(map(abs, value)) <= MAX_ABS_LOGIT:
                return
        except OverflowError:  # an integer past float's range
            pass
    for i, v in enumerate(value):
        where = f"{fld}[{i}]"
        if not is_num(v):
            raise TraceError(name, lineno, where, f"a logit must be a number, found {shown(v)}")
        if type(v) is int and abs(v) > _MAX_FLOAT_INT:
            raise TraceError(name, lineno, where, f"logit {v} is out of range")
        if not math.isfinite(v) or abs(v) > MAX_ABS_LOGIT:
            raise TraceError(
                name,
                lineno,
                where,
                f"logit {v!r} is not plausible: |logit| must be at most {MAX_ABS_LOGIT:g} (it sizes the "
                "dtype's grid step for --near-tie-ulps; a tampered one would ratify any gap)",
            )


def check_top_logprobs(
    name: str,
    lineno: int | None,
    top: Any,
    token_ids: Sequence[int],
    *,
    oracle: bool,
    fld: str = "top_logprobs",
    top_k: int | None = None,
) -> Sequence[TopList]:
    """Validate one record's top-k lists (TraceError naming the first bad element) and return
    them, as a compact `TopLogprobs` when every position has the same k (the rule for an
    oracle), else as given.

    With `top_k` (the header's), a list may hold at most that many pairs; a candidate's one
    more, the chosen token when it falls outside its top-k (vLLM lists it so)."""
    if not isinstance(top, list):
        raise TraceError(name, lineno, fld, "must be a list (one top-k list per generated position)")
    if len(top) != len(token_ids):
        raise TraceError(name, lineno, fld, f"has {len(top)} positions for {len(token_ids)} generated tokens")
    if not top:
        return top
    if top_k is not None:
        _check_list_lengths(name, lineno, fld, top, top_k, oracle)
    compact = _fast_top(top, token_ids, oracle)
    if compact is not None:
        return compact
    for i, pos in enumerate(top):
        _check_position(name, lineno, f"{fld}[{i}]", pos, token_ids[i], oracle)
    return top


def _check_list_lengths(name: str, lineno: int | None, fld: str, top: list[Any], top_k: int, oracle: bool) -> None:
    most = top_k if oracle else top_k + 1
    if set(map(type, top)) <= LIST_ONLY and max(map(len, top)) <= most:
        return
    for i, pos in enumerate(top):
        if isinstance(pos, list) and len(pos) > most:
            beyond = "" if oracle else " (a candidate's top-k plus its chosen token)"
            why = f"holds {len(pos)} pairs, but the header's top_k is {top_k}: at most {most}{beyond}"
            raise TraceError(name, lineno, f"{fld}[{i}]", why)


def _too_much_mass(name: str, lineno: int | None, fld: str, mass: float) -> TraceError:
    why = (
        f"the list's probabilities add up to {mass:.6g}, more than 1 (allowed: {MAX_TOP_MASS:g} for "
        "rounding): not one softmax's top-k"
    )
    return TraceError(name, lineno, fld, why)


def _fast_top(top: list[Any], token_ids: Sequence[int], oracle: bool) -> TopLogprobs | None:
    """The lists as arrays when every rule holds; None means 'look closer', never 'invalid'.

    A trace is mostly top-k lists, so this is the reader's hot loop: every Python object is
    touched once, by C code (zip, array), and the rules run on the arrays.
    """
    if set(map(type, top)) != LIST_ONLY:
        return None
    lengths = set(map(len, top))
    if len(lengths) != 1:
        return None
    k = lengths.pop()
    if k == 0:
        return None
    try:
        # strict: every pair has the same length, and unpacking makes it exactly 2.
        ids_t, lps_t = zip(*chain.from_iterable(top), strict=True)
        # array('q') takes only integers (no floats, strings, lists, None); array('d') only
        # numbers. Both also take bools, checked below.
        ids = np.frombuffer(array("q", ids_t), dtype=np.int64).reshape(len(top), k)
        lps = np.frombuffer(array("d", lps_t), dtype=np.float64).reshape(len(top), k)
    except (TypeError, ValueError, OverflowError):
        return None
    hi, lo = lps.max(), lps.min()
    if not (hi <= 0.0 and lo > -np.inf) or ids.min() < 0:  # also false for NaN
        return None
    # A JSON true/false would read as id 1/0 or logprob 0.0 (true as 1.0 fails above): only
    # where such values occur are the types checked one by one.
    if ids.min() <= 1 and not set(map(type, ids_t)) <= INT_ONLY:
        return None
    if hi == 0.0 and not set(map(type, lps_t)) <= NUM_ONLY:
        return None
    a, b = lps[:, :-1], lps[:, 1:]
    if not (a >= b).all():
        return None
    ties = a == b
    if ties.any() and not (ids[:, :-1][ties] < ids[:, 1:][ties]).all():
        return None
    if k > 1:
        srt = np.sort(ids, axis=1)
        if (srt[:, 1:] == srt[:, :-1]).any():
            return None
        if np.exp(lps).sum(axis=1).max() > MAX_TOP_MASS:
            return None
    # The greedy choice heads its list (ties go to the lowest id, as with torch.argmax).
    if oracle:
        try:
            chosen = np.fromiter(token_ids, dtype=np.int64, count=len(token_ids))
        except OverflowError:  # an id past int64: JSON (and orjson) go up to 2**64 - 1
            return None
        if not np.array_equal(ids[:, 0], chosen):
            return None
    return TopLogprobs(ids, lps)


def _check_position(name: str, lineno: int | None, fld: str, pos: Any, chosen: int, oracle: bool) -> None:
    if not isinstance(pos, list):
        raise TraceError(name, lineno, fld, "must be a list of [token_id, logprob] pairs")
    if oracle and not pos:
        raise TraceError(name, lineno, fld, "is empty: an oracle position must list its chosen token")
    seen: set[int] = set()
    prev: tuple[float, int] | None = None
    for j, pair in enumerate(pos):
        where = f"{fld}[{j}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise TraceError(name, lineno, where, f"must be a [token_id, logprob] pair, found {shown(pair)}")
        tid, lp = pair
        if not is_int(tid):
            raise TraceError(name, lineno, where, f"token id must be an integer, found {shown(tid)}")
        if tid < 0:
            raise TraceError(name, lineno, where, f"negative token id {tid}")
        if not is_num(lp):
            raise TraceError(name, lineno, where, f"logprob must be a number, found {shown(lp)}")
        if type(lp) is int and abs(lp) > _MAX_FLOAT_INT:
            raise TraceError(name, lineno, where, f"logprob {lp} is out of range")
        if math.isnan(lp) or math.isinf(lp):
            raise TraceError(name, lineno, where, f"logprob is {lp}: NaN and infinite logprobs are not allowed")
        if lp > 0:
            raise TraceError(name, lineno, where, f"logprob {lp!r} is above 0")
        if tid in seen:
            raise TraceError(name, lineno, where, f"token id {tid} appears twice in one top-k list")
        seen.add(tid)
        if prev is not None and not (lp < prev[0] or (lp == prev[0] and tid > prev[1])):
            raise TraceError(
                name,
                lineno,
                where,
                f"out of order: [{tid}, {lp!r}] after [{prev[1]}, {prev[0]!r}] "
                "(lists are sorted by logprob descending, then token id ascending)",
            )
        prev = (float(lp), tid)
    mass = math.fsum(math.exp(lp) for _, lp in pos)
    if mass > MAX_TOP_MASS:
        raise _too_much_mass(name, lineno, fld, mass)
    if not oracle:
        return
    if chosen not in seen:
        raise TraceError(name, lineno, fld, f"does not contain the chosen token {chosen}")
    best_id, best_lp = pos[0]
    if best_id != chosen:
        chosen_lp = next(lp for t, lp in pos if t == chosen)
        if chosen_lp == best_lp:
            why = (
                f"the oracle chose {chosen} at an exact tie with {best_id}; torch.argmax (vLLM's greedy "
                "sampler) takes the lowest id among equal maxima, so this record is inconsistent"
            )
        else:
            why = f"the chosen token {chosen} is not the greedy choice: {best_id} has a higher logprob"
        raise TraceError(name, lineno, fld, why)
