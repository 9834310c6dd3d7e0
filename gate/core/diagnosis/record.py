"""The diagnosis record (`gate_diagnosis` 1): per path, each point's error against its honest
band, the first point that leaves it, and the lines a report prints from those fields."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gate.core.diagnosis.capture import FINAL_NORM, LM_HEAD

SCHEMA = 1
# Exit codes of `gate diagnose` beyond the spec's 2 (input) and 3 (engine).
EXIT_NOTHING_LOCATED = 0
EXIT_LOCATED = 1


@dataclass(frozen=True, slots=True)
class LayerError:
    layer: int
    part: str
    module: str
    error: float
    honest_band: float
    ratio: float
    position: int  # the context position of the worst error

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "part": self.part,
            "error": _num(self.error),
            "honest_band": _num(self.honest_band),
            "ratio": _num(self.ratio),
            "module": self.module,
            "position": self.position,
        }


@dataclass(frozen=True, slots=True)
class PathFinding:
    """One path's comparison: every point, and the first beyond the margin (None: none is)."""

    path: str
    layers: tuple[LayerError, ...]
    first: LayerError | None
    missing: tuple[str, ...] = ()  # reference modules the candidate's capture lacks

    @property
    def located(self) -> bool:
        return self.first is not None

    @property
    def worst(self) -> LayerError | None:
        return max(self.layers, key=lambda e: e.ratio, default=None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "first_divergent_layer": None if self.first is None else self.first.layer,
            "first_divergent_part": None if self.first is None else self.first.part,
            "first_divergent_module": None if self.first is None else self.first.module,
            "ratio": None if self.first is None else _num(self.first.ratio),
            "missing_modules": list(self.missing),
            "layers": [e.to_dict() for e in self.layers],
        }


@dataclass(frozen=True, slots=True)
class Diagnosis:
    prompt_id: str
    position: int
    source: str  # the divergence's source (free_run, forced) or "given" (--prompt/--position)
    path: str
    finding: PathFinding
    other: PathFinding | None
    margin: float
    metric: str
    prompt_length: int
    context_length: int
    layer_count: int
    divergence_class: str | None = None
    engines: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    notes: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        return EXIT_LOCATED if self.finding.located else EXIT_NOTHING_LOCATED

    @property
    def summary(self) -> str:
        return f"{finding_line(self.finding, self.margin, self.layer_count)}{self.path_note()}"

    def path_note(self) -> str:
        """Which path shows the deviation, from both findings."""
        if self.other is None:
            return ""
        mine, theirs = self.finding.located, self.other.located
        if mine and not theirs:
            return f"; the {self.other.path} path stays within the band: only the {self.path} path shows it"
        if theirs and not mine:
            where = where_text(self.other.first, self.layer_count) if self.other.first else ""
            return f"; the {self.other.path} path shows it ({where})"
        if mine and theirs:
            assert self.other.first is not None
            return f"; the {self.other.path} path shows it too ({where_text(self.other.first, self.layer_count)})"
        return f"; nor does the {self.other.path} path"

    def to_dict(self) -> dict[str, Any]:
        first = self.finding.first
        return {
            "gate_diagnosis": SCHEMA,
            "prompt_id": self.prompt_id,
            "position": self.position,
            "source": self.source,
            "path": self.path,
            "first_divergent_layer": None if first is None else first.layer,
            "first_divergent_part": None if first is None else first.part,
            "layers": [e.to_dict() for e in self.finding.layers],
            "summary": self.summary,
            "first_divergent_module": None if first is None else first.module,
            "ratio": None if first is None else _num(first.ratio),
            "margin": self.margin,
            "metric": self.metric,
            "layer_count": self.layer_count,
            "prompt_length": self.prompt_length,
            "context_length": self.context_length,
            "divergence_class": self.divergence_class,
            "missing_modules": list(self.finding.missing),
            "other_path": None if self.other is None else self.other.to_dict(),
            "model": self.model,
            "engines": self.engines,
            "notes": list(self.notes),
        }


def where_text(e: LayerError, layer_count: int) -> str:
    """`layer 9, attention` / `the embedding` / `the final norm` / `lm_head`."""
    if e.layer < 0:
        return "the embedding"
    if e.layer >= layer_count and e.part in (FINAL_NORM, LM_HEAD):
        return "the final norm" if e.part == FINAL_NORM else "lm_head"
    return f"layer {e.layer}, {e.part.replace('_', ' ')}"


def times(x: float) -> str:
    if math.isinf(x):
        return "∞×"
    return f"{x:.0f}×" if x >= 10 else f"{x:.1f}×"


def finding_line(f: PathFinding, margin: float, layer_count: int) -> str:
    """`enters at layer 9, attention, decode path: 40× the honest band`, or what stayed within."""
    if f.first is not None:
        return f"enters at {where_text(f.first, layer_count)}, {f.path} path: {times(f.first.ratio)} the honest band"
    worst = f.worst
    if worst is None:
        return f"nothing was compared on the {f.path} path"
    return (
        f"nothing leaves the honest band by more than {margin:g}× on the {f.path} path "
        f"(largest: {times(worst.ratio)} at {where_text(worst, layer_count)})"
    )


def _num(x: float) -> float | str:
    """JSON has no infinity: a non-finite error is written as the string "inf"."""
    return x if math.isfinite(x) else "inf"
