"""Trace format v1 (docs/spec.md): its records, and their encoding.

A trace is JSON Lines: a header, then one prompt record per line. `reader.py` reads one,
refusing every malformed input the spec lists; `validate.py` checks its top-k lists and
evidence fields; here are the records it builds and the atomic writer.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
import orjson

from gate.core.storage.atomic import atomic_write
from gate.core.traces.moe import (
    FORCED_ROUTED_EXPERTS,
    FORCED_ROUTER_TOP,
    ROUTED_EXPERTS,
    ROUTER_TOP,
)

TRACE_VERSION = 1
ROLES: tuple[str, ...] = ("oracle", "candidate")
FINISH_REASONS = ("length", "stop", None)
# `forced_mode`: the path that gave a candidate's forced data (a decode step per position,
# or one prefill over the oracle's tokens).
FORCED_MODES = ("decode", "prefill")
# One top-k list: (token_id, logprob) pairs, logprob descending then token id ascending.
# Stored as parsed (lists of [id, logprob]); treat as read-only.
TopList = Sequence[Sequence[Any]]

# The candidate record field with its top-k at each teacher-forced position (an addition to
# trace v1: candidate only, optional, beside `forced_token_ids`; validated as `top_logprobs`).
FORCED_TOP_KEY = "forced_top_logprobs"


@dataclass(frozen=True, slots=True)
class TraceHeader:
    role: str
    model: str
    top_k: int
    engine: Mapping[str, Any]
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "gate_trace": TRACE_VERSION,
            "role": self.role,
            "model": self.model,
            "top_k": self.top_k,
            "engine": dict(self.engine),
        }
        out.update(self.extra)
        return out


class TopLogprobs(Sequence[list[list[Any]]]):
    """One record's top-k lists as two read-only (positions, k) arrays.

    Reads like the parsed JSON: `top[i]` is a fresh list of `[token_id, logprob]` pairs,
    logprobs the very float64 values the file held. The reader keeps valid lists in this
    form: an eighth of the memory of the parsed lists, and the arrays (`ids`, `logprobs`)
    are there for code that wants numpy.
    """

    __slots__ = ("ids", "logprobs")
    __hash__ = None  # type: ignore[assignment]  # like the lists it stands for

    def __init__(self, ids: np.ndarray, logprobs: np.ndarray) -> None:
        if ids.shape != logprobs.shape or ids.ndim != 2:
            raise ValueError(f"ids {ids.shape} and logprobs {logprobs.shape} must be one (positions, k) shape")
        ids = ids.astype(np.int64, copy=False)
        logprobs = logprobs.astype(np.float64, copy=False)
        ids.flags.writeable = False
        logprobs.flags.writeable = False
        self.ids = ids
        self.logprobs = logprobs

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    @overload
    def __getitem__(self, i: int) -> list[list[Any]]: ...
    @overload
    def __getitem__(self, i: slice) -> list[list[list[Any]]]: ...
    def __getitem__(self, i: int | slice) -> list[list[Any]] | list[list[list[Any]]]:
        if isinstance(i, slice):
            return _pairs_2d(self.ids[i], self.logprobs[i])
        return list(map(list, zip(self.ids[i].tolist(), self.logprobs[i].tolist(), strict=True)))

    def __iter__(self) -> Iterator[list[list[Any]]]:
        return iter(self.tolist())

    def tolist(self) -> list[list[list[Any]]]:
        """The lists as the JSON holds them."""
        return _pairs_2d(self.ids, self.logprobs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TopLogprobs):
            return bool(np.array_equal(self.ids, other.ids) and np.array_equal(self.logprobs, other.logprobs))
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return self.tolist() == [[list(pair) for pair in pos] for pos in other]
        return NotImplemented

    def __repr__(self) -> str:
        n, k = self.ids.shape
        return f"TopLogprobs({n} positions x top-{k})"


def _pairs_2d(ids: np.ndarray, logprobs: np.ndarray) -> list[list[list[Any]]]:
    return [
        list(map(list, zip(row_ids, row_lps, strict=True)))
        for row_ids, row_lps in zip(ids.tolist(), logprobs.tolist(), strict=True)
    ]


@dataclass(frozen=True, slots=True)
class PromptRecord:
    """One prompt's record: trace v1's fields, then the additions the verdict reads (each
    validated once, by the reader or at the engine boundary), then `extra`: any other
    field, kept verbatim and written back as read.

    A key of `extra` that names one of the additions (`EVIDENCE_KEYS`, e.g. `token_logits`)
    is moved into that field when the record is made, so a record built as
    `PromptRecord(..., extra={"token_logits": [...]})` reads the same as one built with
    `token_logits=[...]`; giving both is a `ValueError`."""

    id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    top_logprobs: Sequence[TopList] | None = None
    finish_reason: str | None = None
    prompt: str | None = None
    tokens: tuple[str, ...] | None = None
    forced_token_ids: tuple[int, ...] | None = None
    # Fields beyond v1's that no verdict reads (docs/reference/trace-format.md), kept verbatim.
    extra: Mapping[str, Any] = field(default_factory=dict)
    # The chosen token's raw logit per generated position: sizes the dtype's grid step.
    token_logits: Sequence[float] | None = None
    # MoE routing (gate.core.traces.moe): per input token, per MoE layer; as the trace holds it.
    routed_experts: Sequence[Any] | None = None
    router_top: Sequence[Any] | None = None
    # The teacher-forced decode beside `forced_token_ids` (candidate only): which path gave it
    # ("decode" or "prefill"), its routing, and its own top-k at each forced position.
    forced_mode: str | None = None
    forced_routed_experts: Sequence[Any] | None = None
    forced_router_top: Sequence[Any] | None = None
    forced_top_logprobs: Sequence[TopList] | None = None

    def __post_init__(self) -> None:
        if not self.extra.keys() & EVIDENCE_SET:
            return
        rest = dict(self.extra)
        for key in EVIDENCE_KEYS:
            if key not in rest:
                continue
            value = rest.pop(key)
            if getattr(self, key) is not None:
                raise ValueError(f"record {self.id!r}: {key} given twice (as a field and in extra)")
            object.__setattr__(self, key, value)
        object.__setattr__(self, "extra", rest)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "prompt_token_ids": list(self.prompt_token_ids),
            "token_ids": list(self.token_ids),
        }
        if isinstance(self.top_logprobs, TopLogprobs):
            out["top_logprobs"] = self.top_logprobs.tolist()
        elif self.top_logprobs is not None:
            out["top_logprobs"] = [[[int(t), float(lp)] for t, lp in pos] for pos in self.top_logprobs]
        if self.finish_reason is not None:
            out["finish_reason"] = self.finish_reason
        if self.prompt is not None:
            out["prompt"] = self.prompt
        if self.tokens is not None:
            out["tokens"] = list(self.tokens)
        if self.forced_token_ids is not None:
            out["forced_token_ids"] = list(self.forced_token_ids)
        # The order every engine and workflow has always written: the free run's additions,
        # the other fields, then the forced decode's (added after the free run).
        _put(out, "token_logits", self.token_logits)
        _put(out, ROUTED_EXPERTS, self.routed_experts)
        _put(out, ROUTER_TOP, self.router_top)
        out.update(self.extra)
        _put(out, "forced_mode", self.forced_mode)
        _put(out, FORCED_ROUTED_EXPERTS, self.forced_routed_experts)
        _put(out, FORCED_ROUTER_TOP, self.forced_router_top)
        top = self.forced_top_logprobs
        _put(out, FORCED_TOP_KEY, top.tolist() if isinstance(top, TopLogprobs) else top)
        return out


# The record fields beyond v1's that decide verdicts: typed fields of PromptRecord, each at
# the trace key of its own name.
EVIDENCE_KEYS: tuple[str, ...] = (
    "token_logits",
    ROUTED_EXPERTS,
    ROUTER_TOP,
    "forced_mode",
    FORCED_ROUTED_EXPERTS,
    FORCED_ROUTER_TOP,
    FORCED_TOP_KEY,
)
EVIDENCE_SET = frozenset(EVIDENCE_KEYS)
FORCED_MODES = ("decode", "prefill")


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        out[key] = value


@dataclass(frozen=True, slots=True)
class Trace:
    header: TraceHeader
    records: tuple[PromptRecord, ...]
    path: str = "<memory>"

    @property
    def role(self) -> str:
        return self.header.role

    def by_id(self) -> dict[str, PromptRecord]:
        return {r.id: r for r in self.records}


# --------------------------------------------------------------------------- writing


def encode_header(header: TraceHeader) -> bytes:
    return orjson.dumps(header.to_dict(), option=orjson.OPT_APPEND_NEWLINE)


def encode_record(record: PromptRecord) -> bytes:
    return orjson.dumps(record.to_dict(), option=orjson.OPT_APPEND_NEWLINE)


def encode_trace(header: TraceHeader, records: Iterable[PromptRecord]) -> bytes:
    return encode_header(header) + b"".join(encode_record(r) for r in records)


def write_trace(path: str | os.PathLike[str], trace: Trace, *, overwrite: bool = False) -> None:
    """Write atomically: a temporary file in the same folder, fsync, then rename."""
    atomic_write(path, encode_trace(trace.header, trace.records), overwrite=overwrite)
