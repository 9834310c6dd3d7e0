"""The pin's float32 reference: the truth an honest bf16 engine is measured against.

The honest floor of the distribution verdict compares a bf16 candidate with a bf16 oracle,
so both sides' rounding sits in every figure a lossy build has to stand out from. A pin may
also carry, for every generated position of the oracle, the top-k list of the same weights
computed in float32 along the oracle's prompt and tokens (teacher-forced by transformers:
`gate pin reference`). Measured against those lists, an honest bf16 engine carries one
side's rounding instead of two, and a lossy build still carries its whole loss.

In the pin trace (additions to trace v1, oracle traces only):

- each record's `reference_top_logprobs`: one list per generated token, checked as
  `top_logprobs` is (finite logprobs <= 0, sorted, no repeated id, at most `top_k` entries
  plus one);
- the header's `reference`: how the lists were made (`{"dtype": "float32", ...}`);
- the doctrine's `reference_floor` (`Floor`): the honest floor of the figures measured
  against those lists, and its margin.

A pin whose doctrine names a `reference_floor` must carry the lists at every position (else
it is refused: exit 2). Pure: no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gate.core.traces.trace import TopList, Trace
from gate.core.traces.validate import check_top_logprobs
from gate.core.verdict.coverage import needed
from gate.core.verdict.kl import canonical, kl_mnats
from gate.errors import InputError

REFERENCE_KEY = "reference_top_logprobs"
REFERENCE_HEADER_KEY = "reference"

Reference = Mapping[str, Sequence[TopList]]


def has_reference(trace: Trace) -> bool:
    """Whether any record of the pin carries reference lists."""
    return any(REFERENCE_KEY in r.extra for r in trace.records)


def reference_of(trace: Trace) -> dict[str, Sequence[TopList]] | None:
    """The pin's reference lists by prompt id, checked; None when no record carries any.

    Every record must then carry one list per generated token: a reference with holes
    would let the verdict measure a candidate at fewer positions than its floor was."""
    if not has_reference(trace):
        return None
    out: dict[str, Sequence[TopList]] = {}
    for rec in trace.records:
        if rec.top_logprobs is None:
            continue
        raw = rec.extra.get(REFERENCE_KEY)
        where = f"{trace.path}: prompt {rec.id!r}: field '{REFERENCE_KEY}'"
        if raw is None:
            raise InputError(f"{where}: missing (other records of the pin carry reference lists; every one must)")
        if not isinstance(raw, list) or len(raw) != len(rec.token_ids):
            found = len(raw) if isinstance(raw, list) else type(raw).__name__
            raise InputError(f"{where}: must hold one list per generated token ({len(rec.token_ids)}), found {found}")
        try:
            lists = check_top_logprobs(
                trace.path, None, raw, rec.token_ids, oracle=False, fld=REFERENCE_KEY, top_k=trace.header.top_k
            )
        except InputError as exc:
            raise InputError(f"prompt {rec.id!r}: {exc}") from None
        if any(not len(top) for top in lists):
            raise InputError(f"{where}: an empty list (the reference must list its top-k at every position)")
        out[rec.id] = lists
    return out


def reference_info(trace: Trace) -> Mapping[str, Any] | None:
    """The header's description of the reference (`reference`), or None."""
    raw = trace.header.extra.get(REFERENCE_HEADER_KEY)
    return raw if isinstance(raw, Mapping) else None


def oracle_own_mean(oracle: Trace, reference: Reference, at: Sequence[tuple[str, int]]) -> float | None:
    """The oracle's own mean KL from the reference, in mnats, over the positions `at` (prompt
    id, position): how far the pin's bf16 numbers sit from float32 there. Pin data only."""
    if not at:
        return None
    by_id = oracle.by_id()
    total = 0.0
    for pid, i in at:
        otop = by_id[pid].top_logprobs
        assert otop is not None  # an oracle record
        total += kl_mnats(reference[pid][i], canonical(otop[i], needed(otop[i], oracle.header.top_k)))[0]
    return total / len(at)
