"""MoE routing in traces (an addition to trace v1; docs/guides/moe-routing.md): the header's `moe`
block, the optional record fields that carry routing, and their validation.

Pure: numpy and the error types only (no torch, no other core module), so the trace
reader can use it and the attribution (`gate.core.verdict.routing`) can build on it.

Layout. A record's routing lists one entry per *input token* the model processed, prompt
tokens first: `len(prompt_token_ids) + len(token_ids) - 1` entries (the last generated
token is never fed back), the layout of vLLM's `CompletionOutput.routed_experts`. Entry
`len(prompt_token_ids) - 1 + i` is the forward step that produced generated position i.
Each entry holds one list per MoE layer (in the order of the header's `moe.layers`) of the
`moe.top_k` expert ids that layer chose, in the router's order (highest score first).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gate.errors import TraceError

# Record fields (beyond v1's) that carry routing. The `forced_` ones belong to a candidate's
# teacher-forced decode and span the prompt plus the oracle's tokens.
ROUTED_EXPERTS = "routed_experts"
ROUTER_TOP = "router_top"
FORCED_ROUTED_EXPERTS = "forced_routed_experts"
FORCED_ROUTER_TOP = "forced_router_top"
ROUTING_FIELDS = (ROUTED_EXPERTS, ROUTER_TOP, FORCED_ROUTED_EXPERTS, FORCED_ROUTER_TOP)
# How each engine writes the routers' scores into `router_top`.
SCORE_LOGPROB = "log_softmax"  # softmax routers (Qwen3-MoE, Qwen3.5/3.6 MoE, Mixtral)
SCORE_SIGMOID_BIAS = "sigmoid+bias"  # DeepSeek-V3-style: sigmoid(logits) + correction bias
SCORES = (SCORE_LOGPROB, SCORE_SIGMOID_BIAS)


@dataclass(frozen=True, slots=True)
class MoeInfo:
    """The header's `moe` block: which layers route, how many experts each token gets."""

    layers: tuple[int, ...]
    top_k: int
    num_experts: int
    source: str = ""
    extra: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"layers": list(self.layers), "top_k": self.top_k, "num_experts": self.num_experts}
        if self.source:
            out["source"] = self.source
        out.update(self.extra or {})
        return out


@dataclass(frozen=True, slots=True)
class RoutingFlip:
    """The first MoE routing difference at or before a divergence.

    `token_index` counts input tokens from the prompt's first; `position` is the generated
    position whose logits that step produced (None inside the prompt). `router_gap_mnats`
    is the candidate router's own score of its substitute minus that of the oracle's expert
    (x1000; mnats of router logprob for softmax routers), None when the oracle's expert is
    outside the scores the candidate recorded (then `gap_lower_bound_mnats` bounds it).
    """

    layer: int
    token_index: int
    position: int | None
    oracle_expert: int
    candidate_expert: int
    router_gap_mnats: float | None
    gap_lower_bound_mnats: float | None
    cls: str
    tie_break: str | None
    oracle_experts: tuple[int, ...]
    candidate_experts: tuple[int, ...]
    score: str = SCORE_LOGPROB

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "token_index": self.token_index,
            "position": self.position,
            "oracle_expert": self.oracle_expert,
            "candidate_expert": self.candidate_expert,
            "router_gap_mnats": self.router_gap_mnats,
            "gap_lower_bound_mnats": self.gap_lower_bound_mnats,
            "class": self.cls,
            "tie_break": self.tie_break,
            "oracle_experts": list(self.oracle_experts),
            "candidate_experts": list(self.candidate_experts),
            "score": self.score,
        }


@dataclass(frozen=True, slots=True)
class RoutingSummary:
    """What routing explains in one run (the JSON report's `routing` key)."""

    replayed: bool
    divergences: int
    routing_caused: int
    exact_ties: int
    near_ties: int
    defects: int
    without_routing_data: int = 0
    router_disagreements: int = 0  # under replay: steps where the candidate's own top-k differs
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "replayed": self.replayed,
            "divergences": self.divergences,
            "routing_caused": self.routing_caused,
            "not_routing_caused": self.divergences - self.routing_caused - self.without_routing_data,
            "without_routing_data": self.without_routing_data,
            "flip_classes": {"exact_ties": self.exact_ties, "near_ties": self.near_ties, "defects": self.defects},
            "router_disagreements": self.router_disagreements,
            "source": self.source,
        }


def routing_len(prompt_len: int, generated: int) -> int:
    """How many routing entries a record of these lengths carries."""
    return prompt_len + generated - 1 if generated > 0 and prompt_len > 0 else 0


# --------------------------------------------------------------------------- header


def parse_moe_header(name: str, lineno: int, value: Any) -> MoeInfo:
    """Validate the header's `moe` block."""
    if not isinstance(value, dict):
        raise TraceError(name, lineno, "moe", "must be an object with layers, top_k and num_experts")
    layers = value.get("layers")
    if (
        not isinstance(layers, list)
        or not layers
        or any(type(x) is not int or x < 0 for x in layers)
        or layers != sorted(set(layers))
    ):
        raise TraceError(
            name, lineno, "moe.layers", f"must be a non-empty ascending list of layer indices, found {layers!r}"
        )
    top_k, experts = value.get("top_k"), value.get("num_experts")
    if type(experts) is not int or experts < 1:
        raise TraceError(name, lineno, "moe.num_experts", f"must be an integer >= 1, found {experts!r}")
    if type(top_k) is not int or not 1 <= top_k <= experts:
        raise TraceError(
            name, lineno, "moe.top_k", f"must be an integer from 1 to num_experts ({experts}), found {top_k!r}"
        )
    source = value.get("source", "")
    if not isinstance(source, str):
        raise TraceError(name, lineno, "moe.source", "must be a string")
    score = value.get("score", SCORE_LOGPROB)
    if score not in SCORES:
        raise TraceError(name, lineno, "moe.score", f"must be one of {', '.join(SCORES)}, found {score!r}")
    extra = {k: v for k, v in value.items() if k not in ("layers", "top_k", "num_experts", "source")}
    return MoeInfo(layers=tuple(layers), top_k=top_k, num_experts=experts, source=source, extra=extra)


# --------------------------------------------------------------------------- records


def check_routing_fields(
    name: str,
    lineno: int,
    obj: Mapping[str, Any],
    header_moe: Any,
    *,
    prompt_len: int,
    generated: int,
    forced: int | None,
    oracle: bool,
) -> dict[str, np.ndarray]:
    """Validate a record's routing fields against the header's (raw) `moe` block; return them
    as arrays (experts [n, layers, k]; router_top ids and `.scores`, [n, layers, m] each)."""
    present = [f for f in ROUTING_FIELDS if f in obj]
    if not present:
        return {}
    if header_moe is None:
        raise TraceError(name, lineno, present[0], "routing data needs a `moe` block in the header")
    moe = parse_moe_header(name, 1, header_moe)
    if (oracle and len(present) > 1) or (oracle and present[0] != ROUTED_EXPERTS):
        bad = next(f for f in present if f != ROUTED_EXPERTS)
        raise TraceError(name, lineno, bad, "is for candidate traces only (an oracle records routed_experts)")
    out: dict[str, np.ndarray] = {}
    for fld in present:
        is_forced = fld.startswith("forced_")
        if is_forced and forced is None:
            raise TraceError(name, lineno, fld, "needs forced_token_ids in the same record")
        n = routing_len(prompt_len, forced if is_forced and forced is not None else generated)
        if fld in (ROUTED_EXPERTS, FORCED_ROUTED_EXPERTS):
            out[fld] = _experts(name, lineno, fld, obj[fld], moe, n)
        else:
            ids, scores = _router_top(name, lineno, fld, obj[fld], moe, n)
            out[fld] = ids
            out[fld + ".scores"] = scores
    return out


def _experts(name: str, lineno: int, fld: str, value: Any, moe: MoeInfo, n: int) -> np.ndarray:
    if not isinstance(value, list):
        raise TraceError(name, lineno, fld, "must be a list (one entry per input token)")
    if len(value) != n:
        raise TraceError(name, lineno, fld, f"has {len(value)} entries; prompt plus generated tokens minus one is {n}")
    shape = (n, len(moe.layers), moe.top_k)
    try:
        arr = np.array(value, dtype=np.int64) if n else np.zeros(shape, dtype=np.int64)
    except (ValueError, TypeError, OverflowError):
        arr = None
    if arr is None or arr.shape != shape or not _all_ints(value):
        _walk_experts(name, lineno, fld, value, moe)
        raise TraceError(name, lineno, fld, f"must have shape {list(shape)} (entries x layers x top_k)")
    if n and (arr.min() < 0 or arr.max() >= moe.num_experts):
        i, j, _ = np.argwhere((arr < 0) | (arr >= moe.num_experts))[0]
        raise TraceError(name, lineno, f"{fld}[{i}][{j}]", f"expert id out of range 0..{moe.num_experts - 1}")
    if n and moe.top_k > 1:
        srt = np.sort(arr, axis=2)
        dup = (srt[:, :, 1:] == srt[:, :, :-1]).any(axis=2)
        if dup.any():
            i, j = np.argwhere(dup)[0]
            raise TraceError(name, lineno, f"{fld}[{i}][{j}]", "the same expert is chosen twice")
    return arr.astype(np.int32)


def _all_ints(value: list[Any]) -> bool:
    return all(type(e) is int for entry in value for layer in entry for e in layer)


def _walk_experts(name: str, lineno: int, fld: str, value: list[Any], moe: MoeInfo) -> None:
    """Find the first malformed element, for a precise message (returns if none found)."""
    for i, entry in enumerate(value):
        if not isinstance(entry, list) or len(entry) != len(moe.layers):
            raise TraceError(name, lineno, f"{fld}[{i}]", f"must be a list of {len(moe.layers)} per-layer lists")
        for j, layer in enumerate(entry):
            if not isinstance(layer, list) or len(layer) != moe.top_k:
                raise TraceError(name, lineno, f"{fld}[{i}][{j}]", f"must be a list of {moe.top_k} expert ids")
            for e in layer:
                if type(e) is not int:
                    raise TraceError(name, lineno, f"{fld}[{i}][{j}]", f"expert id must be an integer, found {e!r}")


def _router_top(name: str, lineno: int, fld: str, value: Any, moe: MoeInfo, n: int) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(value, list):
        raise TraceError(name, lineno, fld, "must be a list (one entry per input token)")
    if len(value) != n:
        raise TraceError(name, lineno, fld, f"has {len(value)} entries; prompt plus generated tokens minus one is {n}")
    width: int | None = None
    ids = np.zeros((n, len(moe.layers), 0), dtype=np.int32)
    scores = np.zeros((n, len(moe.layers), 0), dtype=np.float64)
    rows_i: list[list[list[int]]] = []
    rows_s: list[list[list[float]]] = []
    for i, entry in enumerate(value):
        if not isinstance(entry, list) or len(entry) != len(moe.layers):
            raise TraceError(name, lineno, f"{fld}[{i}]", f"must be a list of {len(moe.layers)} per-layer lists")
        ri: list[list[int]] = []
        rs: list[list[float]] = []
        for j, layer in enumerate(entry):
            where = f"{fld}[{i}][{j}]"
            if not isinstance(layer, list) or not layer:
                raise TraceError(name, lineno, where, "must be a non-empty list of [expert, score] pairs")
            if width is None:
                width = len(layer)
            if len(layer) != width:
                raise TraceError(name, lineno, where, f"has {len(layer)} pairs; every list has {width}")
            li, ls = [], []
            prev: tuple[float, int] | None = None
            for pair in layer:
                if not (
                    isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int and type(pair[1]) in (int, float)
                ):
                    raise TraceError(name, lineno, where, f"must hold [expert, score] pairs, found {pair!r}")
                e, s = pair
                if not 0 <= e < moe.num_experts:
                    raise TraceError(name, lineno, where, f"expert id {e} out of range 0..{moe.num_experts - 1}")
                if not math.isfinite(s):
                    raise TraceError(name, lineno, where, f"score {s} is not finite")
                if prev is not None and not (s < prev[0] or (s == prev[0] and e > prev[1])):
                    raise TraceError(name, lineno, where, "out of order (score descending, then expert id ascending)")
                prev = (float(s), e)
                li.append(e)
                ls.append(float(s))
            ri.append(li)
            rs.append(ls)
        rows_i.append(ri)
        rows_s.append(rs)
    if n:
        ids = np.array(rows_i, dtype=np.int32)
        scores = np.array(rows_s, dtype=np.float64)
    return ids, scores


def experts_list(arr: np.ndarray) -> list[list[list[int]]]:
    """An experts array as the trace holds it."""
    return [[[int(e) for e in layer] for layer in entry] for entry in arr.tolist()]


def router_top_list(ids: np.ndarray, scores: np.ndarray) -> list[list[list[list[Any]]]]:
    """A router_top pair of arrays as the trace holds it."""
    return [
        [[[int(e), float(s)] for e, s in zip(li, ls, strict=True)] for li, ls in zip(ei, es, strict=True)]
        for ei, es in zip(ids.tolist(), scores.tolist(), strict=True)
    ]


def as_experts(value: Any) -> np.ndarray | None:
    """Routing rows from a record's extra (list or array) as an int array, or None."""
    if value is None:
        return None
    arr = np.asarray(value)
    return arr if arr.ndim == 3 else None


def moe_of(header_extra: Mapping[str, Any]) -> MoeInfo | None:
    """The `moe` block of a validated header, or None for a dense model."""
    value = header_extra.get("moe")
    if not isinstance(value, dict):
        return None
    return parse_moe_header("<header>", 1, value)


def layer_order(moe: MoeInfo, other: Sequence[int]) -> bool:
    """True when two traces route through the same MoE layers."""
    return tuple(other) == moe.layers
