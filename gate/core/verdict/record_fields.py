"""The fields beyond trace v1 that the verdict reads from a record, each through one accessor
(they live in `PromptRecord.extra` as the reader keeps them): the oracle's raw logits, the
candidate's forced-decode lists and how it forced them."""

from __future__ import annotations

from typing import Any

from gate.core.traces.trace import FORCED_TOP_KEY, PromptRecord


def token_logits(rec: PromptRecord) -> Any:
    """`token_logits`: the raw logit of each chosen token, as the record carries it (or None)."""
    return rec.extra.get("token_logits")


def forced_top_logprobs(rec: PromptRecord) -> Any:
    """`forced_top_logprobs`: the candidate's own list at each forced position, unchecked (or None)."""
    return rec.extra.get(FORCED_TOP_KEY)


def forced_mode(rec: PromptRecord) -> Any:
    """`forced_mode`: how the candidate was teacher-forced (`decode`, `prefill`), as recorded (or None)."""
    return rec.extra.get("forced_mode")
