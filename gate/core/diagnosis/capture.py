"""One engine's activations over one context: capture points in forward order, each an array
[positions, features] (float32) with the context positions its rows belong to."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PREFILL = "prefill"
DECODE = "decode"
PATHS = (PREFILL, DECODE)

EMBEDDING = "embedding"
NORM = "norm"
ATTENTION = "attention"
MLP = "mlp"
EXPERTS = "experts"
ROUTER = "router"
RESIDUAL = "residual"  # the residual stream after a decoder layer (the layer's output)
FINAL_NORM = "final_norm"
LM_HEAD = "lm_head"
# Qwen3.5/3.6's parts (Gated DeltaNet, gated attention, MoE with a shared expert), each a
# sub-part of its block; the part names a report prints are PART_WORDS'.
LINEAR_ATTENTION = "linear_attention"  # the Gated DeltaNet's output (its out_proj's)
LA_CONV = "linear_attention.conv1d"  # the causal conv1d's output (after its SiLU): q, k, v
LA_DELTA = "linear_attention.delta_rule"  # the gated delta rule's core output, before the norm
LA_GATE = "linear_attention.output_gate"  # the output gate z (in_proj_z)
LA_NORM = "linear_attention.norm"  # the gated RMSNorm's output (norm(core) * silu(z))
ATT_GATE = "attention.output_gate"  # sigmoid of the gate half of q_proj's output
ATT_CORE = "attention.core"  # softmax(q.k)v over rotary positions, before the output gate
ROUTER_CHOICE = "router.choice"  # the chosen experts' weights, [positions, experts] (0 elsewhere)
ROUTED = "experts.routed"  # the routed experts' weighted sum
SHARED = "experts.shared"  # the shared expert's output, before its gate
SHARED_GATE = "experts.shared_gate"  # the shared expert's sigmoid gate
SHARED_GATED = "experts.shared_gated"  # what the shared expert adds: the block's output minus the routed experts'
SUB_PARTS = (
    LINEAR_ATTENTION,
    LA_CONV,
    LA_DELTA,
    LA_GATE,
    LA_NORM,
    ATT_GATE,
    ATT_CORE,
    ROUTER_CHOICE,
    ROUTED,
    SHARED,
    SHARED_GATE,
    SHARED_GATED,
)
PARTS = (EMBEDDING, NORM, ATTENTION, MLP, EXPERTS, ROUTER, RESIDUAL, FINAL_NORM, LM_HEAD, *SUB_PARTS)
PART_WORDS = {
    LINEAR_ATTENTION: "linear attention: out_proj",
    LA_CONV: "linear attention: conv1d",
    LA_DELTA: "linear attention: gated delta rule",
    LA_GATE: "linear attention: output gate (z)",
    LA_NORM: "linear attention: gated RMSNorm (norm)",
    ATT_GATE: "attention: output gate",
    ATT_CORE: "attention: softmax(q·k)·v with rotary positions, before the output gate",
    ROUTER_CHOICE: "MoE router: chosen experts",
    ROUTED: "MoE: routed experts",
    SHARED: "MoE: shared expert",
    SHARED_GATE: "MoE: shared expert's sigmoid gate",
    SHARED_GATED: "MoE: shared expert × its sigmoid gate",
}
# Sub-part capture points by (the layer's child, the name after it): module names where the
# module exists (`linear_attn.conv1d`), else a name for the value read (`linear_attn.delta_rule`).
SUB_NAMES = {
    ("linear_attn", "conv1d"): LA_CONV,
    ("linear_attn", "delta_rule"): LA_DELTA,
    ("linear_attn", "in_proj_z"): LA_GATE,
    ("linear_attn", "norm"): LA_NORM,
    ("self_attn", "output_gate"): ATT_GATE,
    ("self_attn", "core"): ATT_CORE,
    ("mlp", "gate.choice"): ROUTER_CHOICE,
    ("mlp", "experts"): ROUTED,
    ("mlp", "shared_expert"): SHARED,
    ("mlp", "shared_expert_gate"): SHARED_GATE,
    ("mlp", "shared_expert.gated"): SHARED_GATED,
}


def part_words(part: str) -> str:
    """A part as a report names it: `linear attention: conv1d`, `final norm`."""
    return PART_WORDS.get(part, part.replace("_", " "))


# A decoder layer's child modules by name, as the model families gate captures call them.
ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention", "linear_attn", "mixer")
MLP_NAMES = ("mlp", "feed_forward", "block_sparse_moe", "ffn", "moe")


def part_of(name: str, module: Any, expert_attrs: tuple[str, ...] = ("experts",)) -> str | None:
    """The part a decoder layer's child module named `name` is (None: not one gate compares);
    an MLP holding any of `expert_attrs` is a mixture of experts."""
    lower = name.lower()
    if "norm" in lower:
        return NORM
    if lower == "linear_attn":
        return LINEAR_ATTENTION
    if lower in ATTENTION_NAMES:
        return ATTENTION
    if lower in MLP_NAMES:
        return EXPERTS if any(hasattr(module, a) for a in expert_attrs) else MLP
    return None


@dataclass(frozen=True, slots=True)
class Point:
    """Where a tensor was read: the decoder layer (-1 the embedding, the layer count for the
    final norm and lm_head), the part, and the module's name in the transformers model
    (`model.layers.9.self_attn`), which tells a layer's two norms apart."""

    layer: int
    part: str
    module: str

    def __post_init__(self) -> None:
        if self.part not in PARTS:
            raise ValueError(f"unknown part {self.part!r} (known: {', '.join(PARTS)})")


@dataclass(frozen=True, slots=True)
class Tensor:
    """One capture point's rows: `values[i]` is the output at context position `positions[i]`."""

    point: Point
    positions: tuple[int, ...]
    values: np.ndarray  # [len(positions), features], float32

    def __post_init__(self) -> None:
        if self.values.ndim != 2 or self.values.shape[0] != len(self.positions):
            raise ValueError(f"{self.point.module}: {self.values.shape} values for {len(self.positions)} positions")


@dataclass(frozen=True, slots=True)
class Capture:
    """An engine's capture over one context through one path, points in forward order."""

    path: str
    context_length: int
    tensors: tuple[Tensor, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def by_module(self) -> dict[str, Tensor]:
        return {t.point.module: t for t in self.tensors}

    @property
    def layer_count(self) -> int:
        return max((t.point.layer for t in self.tensors if t.point.part == RESIDUAL), default=-1) + 1

    @classmethod
    def of_modules(
        cls,
        path: str,
        context_length: int,
        modules: Mapping[str, np.ndarray],
        positions: Mapping[str, Sequence[int]] | None = None,
    ) -> Capture:
        """A capture from arrays named as transformers names the modules (`model.layers.9.mlp`,
        `model.layers.9` for the residual stream after layer 9, `model.norm`, `lm_head`):
        `modules[name]` holds the module's output at `positions[name]` (every position of the
        context, 0..context_length-1, when not given), one row each, as float32; the modules in forward
        order (gate compares them in the reference's order whatever this one is). A name that
        is none of gate's capture points, or rows that do not match their positions, is a
        ValueError naming it. This is what a plugin's `capture_path` returns."""
        if path not in PATHS:
            raise ValueError(f"path {path!r}: expected prefill or decode")
        layers = [int(m.group(1)) for name in modules if (m := _IN_LAYER.search(name)) is not None]
        layer_count = max(layers, default=-1) + 1
        tensors: list[Tensor] = []
        for name, values in modules.items():
            point = point_of_module(name, layer_count)
            if point is None:
                raise ValueError(f"{name!r} is not a module gate captures (names like model.layers.0.mlp)")
            rows = np.asarray(values, dtype=np.float32)
            rows = rows[0] if rows.ndim == 3 and rows.shape[0] == 1 else rows
            at = tuple(int(p) for p in positions[name]) if positions and name in positions else tuple(range(len(rows)))
            if any(not 0 <= p < context_length for p in at):
                raise ValueError(f"{name!r}: positions outside the context's 0..{context_length - 1}")
            tensors.append(Tensor(point, at, rows))
        return cls(path, context_length, tuple(tensors))


def stack_rows(
    chunks: Iterable[tuple[int, np.ndarray]], width: int | None = None
) -> tuple[tuple[int, ...], np.ndarray]:
    """Rows from several forwards, each (first position, [rows, features]), as one array."""
    positions: list[int] = []
    arrays: list[np.ndarray] = []
    for start, rows in chunks:
        positions.extend(range(start, start + rows.shape[0]))
        arrays.append(rows)
    if not arrays:
        return (), np.zeros((0, width or 0), dtype=np.float32)
    values = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
    return tuple(positions), values.astype(np.float32, copy=False)


def aligned(a: Tensor, b: Tensor) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """The rows of `a` and `b` at the positions both have, in position order."""
    if a.positions == b.positions and all(x < y for x, y in zip(a.positions, a.positions[1:], strict=False)):
        return a.positions, a.values, b.values  # the same rows already in order: no copies
    common = sorted(set(a.positions) & set(b.positions))
    ia = {p: i for i, p in enumerate(a.positions)}
    ib = {p: i for i, p in enumerate(b.positions)}
    return tuple(common), a.values[[ia[p] for p in common]], b.values[[ib[p] for p in common]]


def capture_to_arrays(capture: Capture) -> dict[str, np.ndarray]:
    """The capture as seven named arrays (an .npz without pickles): the path, the context
    length, each tensor's point (layer, part, module), row count and width, and every
    tensor's positions and float32 values end to end (a member per tensor made a capture of
    the Qwen3.6 test checkpoint 185 zip members, most of gate's diagnosis cache's write)."""
    tensors = capture.tensors
    return {
        "path": np.array(capture.path),
        "context_length": np.array(capture.context_length),
        "points": np.array([[str(t.point.layer), t.point.part, t.point.module] for t in tensors], dtype=str).reshape(
            len(tensors), 3
        ),
        "rows": np.array([t.values.shape[0] for t in tensors], dtype=np.int64),
        "widths": np.array([t.values.shape[1] for t in tensors], dtype=np.int64),
        "positions": np.fromiter((p for t in tensors for p in t.positions), dtype=np.int64),
        "values": np.concatenate([np.asarray(t.values, dtype=np.float32).reshape(-1) for t in tensors])
        if tensors
        else np.zeros(0, dtype=np.float32),
    }


def capture_from_arrays(arrays: Mapping[str, np.ndarray]) -> Capture:
    """`capture_to_arrays`'s capture back; ValueError when the arrays do not add up (a row
    count, width or length that disagrees with another, a negative one)."""
    points, rows, widths = arrays["points"], arrays["rows"], arrays["widths"]
    positions, values = arrays["positions"], np.asarray(arrays["values"], dtype=np.float32)
    n = len(rows)
    if points.shape != (n, 3) or widths.shape != (n,) or rows.ndim != 1 or positions.ndim != 1 or values.ndim != 1:
        raise ValueError("a capture's arrays: points, rows and widths disagree in count")
    if n and (int(rows.min()) < 0 or int(widths.min()) < 1):
        raise ValueError("a capture's arrays: a negative row count or a width below 1")
    sizes = [int(r) * int(w) for r, w in zip(rows, widths, strict=True)]
    if sum(int(r) for r in rows) != positions.size or sum(sizes) != values.size:
        raise ValueError("a capture's arrays: the rows and widths do not add up to the positions and values")
    tensors: list[Tensor] = []
    at_row = at_value = 0
    all_positions = [int(p) for p in positions]
    for (layer, part, module), r, w, size in zip(points, rows, widths, sizes, strict=True):
        r, w = int(r), int(w)
        tensors.append(
            Tensor(
                Point(int(str(layer)), str(part), str(module)),
                tuple(all_positions[at_row : at_row + r]),
                values[at_value : at_value + size].reshape(r, w),
            )
        )
        at_row, at_value = at_row + r, at_value + size
    return Capture(str(arrays["path"]), int(arrays["context_length"]), tuple(tensors))


def activations_of(capture: Capture, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """A capture as `CapturesActivations.capture_activations` answers: module name -> its rows
    [positions, features] (float32) for the points that hold every position of the context
    (lm_head under `logits_to_keep=1` holds only the last), only those in `names` when given."""
    wanted = None if names is None else set(names)
    every = tuple(range(capture.context_length))
    return {
        t.point.module: t.values
        for t in capture.tensors
        if t.positions == every and (wanted is None or t.point.module in wanted)
    }


_IN_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.([^.]+))?")


def point_of_module(module: str, layer_count: int) -> Point | None:
    """The capture point a transformers module name stands for (`model.layers.9` the residual
    stream after layer 9, `model.layers.9.self_attn` its attention, `model.norm` the final
    norm, ...), or None for a name that is none of gate's points."""
    m = _IN_LAYER.search(module)
    if m is not None:
        layer, child = int(m.group(1)), (m.group(2) or "").lower()
        rest = module[m.end() :].lower()
        if not child:
            return Point(layer, RESIDUAL, module)
        sub = SUB_NAMES.get((child, rest.strip(".")))
        if sub is not None:
            return Point(layer, sub, module)
        if child == "linear_attn":
            return Point(layer, LINEAR_ATTENTION, module) if not rest else None
        if "norm" in child:
            return Point(layer, NORM, module)
        if "attn" in child or "attention" in child or child == "mixer":
            return Point(layer, ATTENTION, module) if not rest else None
        if rest.strip(".") in ("gate", "router"):
            return Point(layer, ROUTER, module)
        if "experts" in rest:
            return None
        return Point(layer, MLP, module) if not rest else None
    lower = module.lower()
    if "embed" in lower:
        return Point(-1, EMBEDDING, module)
    if lower.endswith("lm_head"):
        return Point(layer_count, LM_HEAD, module)
    if lower.endswith("norm"):
        return Point(layer_count, FINAL_NORM, module)
    return None
