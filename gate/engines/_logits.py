"""Logprobs and top-k lists from a runtime's raw logits, with numpy only.

The llama.cpp and ONNX Runtime GenAI engines read a [vocab] float32 logits row from their
runtime and make the trace's top-k list here, so that both compute it the same way:

- log-softmax: `float64(logit) - lse`, with `lse = max + log(sum(exp(logit - max)))`, the
  exponentials in float32 and their sum in float64 (within about 1e-8 nats of an all-float64
  computation, at a sixth of its cost: 0.1 ms for a 49k vocabulary). The subtraction is in
  float64, so equal logits give bit-identical logprobs (an exact tie in the runtime stays an
  exact tie in the trace) and distinct float32 logits never merge, as they can when a
  float32 log-softmax rounds. The values are not rounded to float32: a candidate's list is
  provenance for reports, not adjudicated.
- the list is exact at the k-th place: every id strictly above the k-th value, then the
  lowest ids equal to it, ordered logprob descending then id ascending (the trace order);
  the chosen token is always in it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gate.engines._common import Pairs, sort_top
from gate.errors import EngineError


def logsumexp(row: np.ndarray[Any, Any]) -> float:
    """log(sum(exp(row))) of a float32 row: float32 exponentials, a float64 sum."""
    top = float(row.max())
    return top + math.log(float(np.exp(row - np.float32(top)).sum(dtype=np.float64)))


def log_softmax64(logits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The logprobs of a whole [vocab] row, as `top_k_pairs` computes them (float64)."""
    row = np.asarray(logits, dtype=np.float32).reshape(-1)
    return row.astype(np.float64) - logsumexp(row)


def top_k_pairs(logits: np.ndarray[Any, Any], k: int, chosen: int, *, position: int = 0) -> Pairs:
    """The top-k list of a [vocab] float32 logits row as trace pairs, always including `chosen`."""
    row = np.asarray(logits, dtype=np.float32).reshape(-1)
    if not (math.isfinite(float(row.max())) and math.isfinite(float(row.min()))):
        raise EngineError(f"the model produced non-finite logits at position {position} (NaN or inf)")
    lse = logsumexp(row)
    vocab = row.shape[0]
    k = max(1, min(k, vocab))
    # The k-th largest logit; ties at that place are then settled by id. Logprobs are a
    # monotone function of the logits, so selecting on logits selects on logprobs.
    kth = row[np.argpartition(row, vocab - k)[vocab - k]]
    above = np.flatnonzero(row > kth)
    at = np.flatnonzero(row == kth)[: k - above.size]
    ids = np.concatenate([above, at])
    if chosen not in ids:
        ids = np.append(ids, chosen)
    logprobs = row[ids].astype(np.float64) - lse
    return sort_top(zip(ids.tolist(), logprobs.tolist(), strict=True))


def first_argmax(logits: np.ndarray[Any, Any]) -> int:
    """The lowest id among equal maxima: numpy documents `argmax` as returning "the indices
    corresponding to the first occurrence" of the maximum."""
    return int(np.argmax(np.asarray(logits).reshape(-1)))


def last_argmax(logits: np.ndarray[Any, Any]) -> int:
    """The highest id among equal maxima (the rule of ggml's CPU `argmax` op)."""
    row = np.asarray(logits).reshape(-1)
    return int(row.shape[0] - 1 - np.argmax(row[::-1]))
