"""Candidate traces made from the default model's own pin, for the integration tests (no
model is loaded): the honest one is the pin's oracle trace with its role changed to
candidate; the defective one takes, at one position far from any tie, the oracle's
second-ranked token instead of its first (and reports no lists of its own)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gate.core.pins.pin import load_pin
from gate.core.traces.trace import Trace, encode_trace
from gate.models.default import DEFAULT_MODEL

# A planted flip must be a defect under any doctrine: the oracle's top-2 gap is this wide.
DEFECT_GAP_NATS = 5.0


def default_pin_trace() -> Trace:
    return load_pin(DEFAULT_MODEL).trace


def honest_candidate(pin: Trace) -> Trace:
    return replace(pin, header=replace(pin.header, role="candidate"), path="<honest>")


def planted_defect(pin: Trace) -> tuple[Trace, str, int]:
    """The pin's trace as a candidate with one defect planted: (trace, prompt id, position)."""
    for n, rec in enumerate(pin.records):
        assert rec.top_logprobs is not None
        for i, top in enumerate(rec.top_logprobs):
            if len(top) > 1 and top[0][0] == rec.token_ids[i] and top[0][1] - top[1][1] > DEFECT_GAP_NATS:
                tokens = list(rec.token_ids)
                tokens[i] = int(top[1][0])
                bad = replace(rec, token_ids=tuple(tokens), top_logprobs=None, extra={})
                records = tuple(
                    bad if k == n else replace(r, top_logprobs=None, extra={}) for k, r in enumerate(pin.records)
                )
                header = replace(pin.header, role="candidate", top_k=0)
                return Trace(header=header, records=records, path="<defective>"), rec.id, i
    raise AssertionError("the pin has no position far from a tie")


def planted_flip(pin: Trace, low_nats: float = 0.7, high_nats: float = 1.5) -> Trace:
    """The pin's trace as a candidate that reports everything (its own lists, forced ids and
    lists for every position) and flips one token where the oracle's top-2 gap is between
    `low_nats` and `high_nats`: a defect under the pin's doctrine, a near tie under a
    threshold above the gap. Its own list puts its token first, a thousandth of a nat above the oracle's, so it
    is greedy over what it reports, and that one position keeps its distribution within the
    pin's floor."""
    for n, rec in enumerate(pin.records):
        assert rec.top_logprobs is not None
        for i, top in enumerate(rec.top_logprobs):
            gap = top[0][1] - top[1][1] if len(top) > 1 else 0.0
            if top[0][0] == rec.token_ids[i] and low_nats < gap < high_nats:
                lists = [[(int(t), float(lp)) for t, lp in pos] for pos in rec.top_logprobs]
                (o, lo), (c, _) = lists[i][0], lists[i][1]
                # Its token just above the oracle's (not the two swapped: a whole swapped gap
                # is a KL of hundreds of mnats, beyond the float32 reference's floor alone).
                lists[i] = [(c, lo), (o, lo - 1e-3), *lists[i][2:]]
                tokens = list(rec.token_ids)
                tokens[i] = c
                extra = {"forced_top_logprobs": lists}
                flipped = replace(
                    rec, token_ids=tuple(tokens), top_logprobs=lists, forced_token_ids=tuple(tokens), extra=extra
                )
                records = tuple(flipped if k == n else r for k, r in enumerate(pin.records))
                return Trace(header=replace(pin.header, role="candidate"), records=records, path="<flipped>")
    raise AssertionError(f"the pin has no oracle gap between {low_nats} and {high_nats} nats")


def write_trace_file(trace: Trace, path: Path) -> Path:
    path.write_bytes(encode_trace(trace.header, trace.records))
    return path
