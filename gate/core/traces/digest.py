"""A trace's identity as one hash: what `gate diff` checks to know that two reports were
judged against the same pin.

The digest covers what decides a judgement's positions: the model, the suite's hash and
the recording time the header states, and each record's id, prompt token ids and greedy
token ids, in order. A pin re-recorded (a new `created_at`), a changed suite or another
model gives another digest; the same pin read from any folder gives the same one.
"""

from __future__ import annotations

import hashlib

from gate.core.traces.trace import Trace


def trace_sha256(trace: Trace) -> str:
    """The hex sha256 of `trace`'s identity (see the module's docstring)."""
    h = hashlib.sha256()
    extra = trace.header.extra
    for value in (trace.header.model, extra.get("suite_sha256"), extra.get("created_at")):
        h.update(repr(value).encode("utf-8") + b"\x1e")
    for rec in trace.records:
        h.update(rec.id.encode("utf-8") + b"\x1f")
        h.update(",".join(map(str, rec.prompt_token_ids)).encode("ascii") + b"\x1f")
        h.update(",".join(map(str, rec.token_ids)).encode("ascii") + b"\x1e")
    return h.hexdigest()
