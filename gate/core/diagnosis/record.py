"""The diagnosis record (`gate_diagnosis` 1): per path, each point's error against its honest
band, the first point that leaves it, and the lines a report prints from those fields."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gate.core.diagnosis.capture import FINAL_NORM, LM_HEAD, part_words

SCHEMA = 1
# Exit codes of `gate diagnose` beyond the spec's 2 (input) and 3 (engine).
EXIT_NOTHING_LOCATED = 0
EXIT_LOCATED = 1
# How many of the largest excursions a diagnosis ranks, located or not.
RANKED = 5


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
class GateFailure:
    """Why the gate run that chose the diagnosed position failed (`reasons`, each a figure
    of its verdict: "4 defects", "the distribution is beyond the honest floor: mean KL ..."),
    how the position was chosen from it (`chosen`), and the path its failure came through."""

    reasons: tuple[str, ...]
    chosen: str
    path: str

    def to_dict(self) -> dict[str, Any]:
        return {"reasons": list(self.reasons), "chosen": self.chosen, "path": self.path}


@dataclass(frozen=True, slots=True)
class Excursion:
    """One point's error against its band on one path: a row of the ranking."""

    path: str
    point: LayerError

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, **self.point.to_dict()}


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
    # The failed gate run that chose the position (None: the position was named, or the run passed).
    gate_failure: GateFailure | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_LOCATED if self.finding.located else EXIT_NOTHING_LOCATED

    @property
    def located(self) -> bool:
        return self.finding.located or (self.other is not None and self.other.located)

    def excursions(self, n: int = RANKED) -> tuple[Excursion, ...]:
        """The `n` largest errors against their bands over both paths, largest first (forward
        order among equals), whether or not any is past the margin."""
        rows = [Excursion(f.path, e) for f in (self.finding, self.other) if f is not None for e in f.layers]
        ranked = sorted(enumerate(rows), key=lambda ie: (-ie[1].point.ratio, ie[0]))
        return tuple(e for _, e in ranked[:n])

    @property
    def summary(self) -> str:
        if self.gate_failure is not None and not self.located:
            return self.diffuse_line(self.gate_failure)
        return f"{finding_line(self.finding, self.margin, self.layer_count)}{self.path_note()}"

    def diffuse_line(self, failure: GateFailure) -> str:
        """A failed gate that no point locates: what failed, that nothing passes the margin,
        which path the failure came through and whether that path was seen, and the ranked
        excursions that point where to look."""
        paths = " or ".join(dict.fromkeys(f.path for f in (self.finding, self.other) if f is not None))
        out = (
            f"the gate failed ({'; '.join(failure.reasons)}) and no point leaves the honest band by more than "
            f"{self.margin:g}× on the {paths} path"
        )
        if failure.path not in (self.path, None if self.other is None else self.other.path):
            out += (
                f"; its failure came through the {failure.path} path, which this capture does not reach "
                f"(it sees the {self.path} path only): a capture through both paths (capture_path) can locate it"
            )
        else:
            out += f": a diffuse failure, through the {failure.path} path ({failure.chosen})"
        ranked = self.excursions(3)
        if ranked:
            words = ", ".join(
                f"{times(e.point.ratio)} at {where_text(e.point, self.layer_count)} ({e.path})" for e in ranked
            )
            out += f"; largest excursions: {words}"
        return out

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
            # Additions: the ranked excursions of both paths, and the failed gate run, if any.
            "excursions": [e.to_dict() for e in self.excursions()],
            "gate_failure": None if self.gate_failure is None else self.gate_failure.to_dict(),
        }


def where_text(e: LayerError, layer_count: int) -> str:
    """`layer 9, attention` / `layer 2, linear attention: conv1d` / `the embedding` / `the final
    norm` / `lm_head`."""
    if e.layer < 0:
        return "the embedding"
    if e.layer >= layer_count and e.part in (FINAL_NORM, LM_HEAD):
        return "the final norm" if e.part == FINAL_NORM else "lm_head"
    return f"layer {e.layer}, {part_words(e.part)}"


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
