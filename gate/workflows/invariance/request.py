"""`gate invariance` as one request: the candidate against itself under schedules
(`gate.workflows.invariance.core`), its engine loaded once per set of options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gate.core.engine import Engine
from gate.core.pins.pin import doctrine_for, load_pin
from gate.core.verdict.invariance import InvarianceResult
from gate.workflows.common.requests import DoctrineFlags, EngineRequest, ProgressDisplay, default_model, no_progress
from gate.workflows.invariance.core import InvariancePlan, parse_cells, run_invariance


@dataclass(frozen=True, slots=True)
class InvarianceRequest:
    """Everything `gate invariance` was asked."""

    model: str | None = None
    engine: EngineRequest = field(default_factory=EngineRequest)
    schedules: tuple[str, ...] | None = None
    batch: int = 8
    seed: int = 0
    threads: int = 2
    chunk: int = 8
    doctrine: DoctrineFlags = field(default_factory=DoctrineFlags)
    strict: bool = False
    pins_dir: Path | None = None

    def pin_model(self) -> str:
        return self.model or default_model()

    def plan(self) -> InvariancePlan:
        """The cells and their sizes, checked (before any work, with the engine options and
        the doctrine flags)."""
        self.engine.options()
        self.doctrine.check()
        return InvariancePlan(
            cells=parse_cells(self.schedules),
            batch=self.batch,
            seed=self.seed,
            threads=self.threads,
            chunk=self.chunk,
            strict=self.strict,
        )


def invariance_request(request: InvarianceRequest, *, display: ProgressDisplay = no_progress) -> InvarianceResult:
    from gate.engines.registry import load_engine, resolve

    plan = request.plan()
    opts = request.engine.options()
    pin = load_pin(request.pin_model(), request.pins_dir)
    doctrine = doctrine_for(pin, request.doctrine.check(), strict=request.strict)
    name = request.engine.name()
    engine_class = resolve(name)
    target = request.engine.weights(pin)

    def load(options_now: Mapping[str, str]) -> Engine:
        return load_engine(name, target, options_now)

    with display() as progress:
        return run_invariance(
            load, engine_class, pin, doctrine, plan, engine_name=name, options=opts, progress=progress
        )
