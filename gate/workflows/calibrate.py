"""Calibration, the run: the candidate engine over a pin, for `gate.core.calibration.calibrate` to measure.

The measuring (drift distributions, the recommended doctrine) is pure and lives in the
core; this only produces the candidate's trace: a free run with top-k logprobs, forced
along the oracle's tokens where it diverged.
"""

from __future__ import annotations

from collections.abc import Callable

from gate.core.engine import Engine
from gate.core.pins.pin import Pin
from gate.core.traces.trace import Trace
from gate.core.verdict.doctrine import Doctrine
from gate.workflows.engine_calls import open_engine
from gate.workflows.progress import QUIET, Progress
from gate.workflows.run import gate_against_pin


def candidate_trace(pin: Pin, load: Callable[[], Engine], name: str, *, progress: Progress = QUIET) -> Trace:
    """The candidate's trace over `pin`: the engine `load()` builds runs the whole gate
    (checks, free run, forced decode) and is closed after."""
    with open_engine(load, name) as engine:
        return gate_against_pin(engine, pin, Doctrine(), progress=progress).candidate
