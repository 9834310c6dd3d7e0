"""Logprobs and top-k lists from a runtime's raw logits, with numpy only.

The llama.cpp and ONNX Runtime GenAI engines read a [vocab] float32 logits row from their
runtime and make the trace's top-k list here, so that both compute it the same way:

- log-softmax in float64 over the float32 logits: `logit - (max + log(sum(exp(logit - max))))`.
  float64 keeps every logprob within an ulp or so of the exact value; the function is
  monotone and applied elementwise, so equal logits give bit-identical logprobs and an
  exact tie in the runtime stays an exact tie in the trace (and distinct logits never
  merge, as they can when a float32 log-softmax rounds). The values are not rounded to
  float32: a candidate's list is provenance for reports, not adjudicated.
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


def log_softmax64(logits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """float64 log-softmax of a [vocab] row (any float dtype)."""
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    top = float(x.max())
    return x - (top + math.log(float(np.exp(x - top).sum())))


def top_k_pairs(logits: np.ndarray[Any, Any], k: int, chosen: int, *, position: int = 0) -> Pairs:
    """The top-k list of a [vocab] logits row as trace pairs, always including `chosen`."""
    row = np.asarray(logits).reshape(-1)
    if not np.isfinite(row).all():
        raise EngineError(f"the model produced non-finite logits at position {position} (NaN or inf)")
    logprobs = log_softmax64(row)
    vocab = logprobs.shape[0]
    k = max(1, min(k, vocab))
    # argpartition finds the k-th value; ties at that place are then settled by id.
    kth = float(np.partition(logprobs, vocab - k)[vocab - k])
    above = np.flatnonzero(logprobs > kth)
    at = np.flatnonzero(logprobs == kth)[: k - above.size]
    ids = np.concatenate([above, at])
    pairs = sort_top(zip(ids.tolist(), logprobs[ids].tolist(), strict=True))
    if all(t != chosen for t, _ in pairs):
        pairs = sort_top([(t, lp) for t, lp in pairs] + [(chosen, float(logprobs[chosen]))])
    return pairs


def first_argmax(logits: np.ndarray[Any, Any]) -> int:
    """The lowest id among equal maxima: numpy documents `argmax` as returning "the indices
    corresponding to the first occurrence" of the maximum."""
    return int(np.argmax(np.asarray(logits).reshape(-1)))


def last_argmax(logits: np.ndarray[Any, Any]) -> int:
    """The highest id among equal maxima (the rule of ggml's CPU `argmax` op)."""
    row = np.asarray(logits).reshape(-1)
    return int(row.shape[0] - 1 - np.argmax(row[::-1]))
