"""Calibration, the run: the candidate engine over a pin (or two trace files), for
`gate.core.calibration.calibrate` to measure (`gate calibrate`, one `CalibrateRequest`).

The measuring (drift distributions, the recommended doctrine) is pure and lives in the
core; this only produces the candidate's trace: a free run with top-k logprobs, forced
along the oracle's tokens where it diverged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gate.core.calibration.calibrate import calibrate
from gate.core.calibration.stats import Calibration
from gate.core.engine import Engine
from gate.core.pins.pin import Pin, load_pin, pin_own_doctrine
from gate.core.traces.reader import read_trace
from gate.core.traces.trace import Trace, write_trace
from gate.core.verdict.doctrine import Doctrine, header_doctrine, resolve_doctrine
from gate.errors import InputError
from gate.workflows.common.engine_calls import open_engine
from gate.workflows.common.progress import QUIET, Progress
from gate.workflows.common.requests import EngineRequest, ProgressDisplay, Say, default_model, no_progress, silent
from gate.workflows.run.core import gate_against_pin


def candidate_trace(pin: Pin, load: Callable[[], Engine], name: str, *, progress: Progress = QUIET) -> Trace:
    """The candidate's trace over `pin`: the engine `load()` builds runs the whole gate
    (checks, free run, forced decode) and is closed after."""
    with open_engine(load, name) as engine:
        return gate_against_pin(engine, pin, Doctrine(), progress=progress).candidate


@dataclass(frozen=True, slots=True)
class CalibrateRequest:
    """Everything `gate calibrate` was asked: two trace files, or a model whose pin the
    candidate engine runs over."""

    oracle: Path | None = None
    candidate: Path | None = None
    model: str | None = None
    engine: EngineRequest = field(default_factory=EngineRequest)
    pins_dir: Path | None = None
    dtype: str | None = None
    save_trace: Path | None = None
    force: bool = False

    def pin_model(self) -> str:
        return self.model or default_model()


def calibrate_request(
    request: CalibrateRequest, *, say: Say = silent, display: ProgressDisplay = no_progress
) -> Calibration:
    oracle, candidate = request.oracle, request.candidate
    opts = request.engine.options()
    if (oracle is None) != (candidate is None):
        raise InputError("gate calibrate takes two trace files (ORACLE CANDIDATE) or none (run the engine on the pin)")
    if oracle is not None and candidate is not None:
        given = [
            f
            for f, v in (
                ("--engine", request.engine.engine),
                ("--engine-opt", opts),
                ("--model-path", request.engine.model_path),
                ("--save-trace", request.save_trace),
                ("--model", request.model),
            )
            if v
        ]
        if given:
            raise InputError(f"two trace files are calibrated as they are: {', '.join(given)} cannot go with them")
        o = read_trace(oracle, role="oracle")
        c = read_trace(candidate, role="candidate")
        where = str(oracle)
        own = header_doctrine(o.header.extra, where)
    else:
        pin = load_pin(request.pin_model(), request.pins_dir)
        o = pin.trace
        name = request.engine.name()
        with display() as progress:
            c = candidate_trace(pin, request.engine.loader(pin, opts, name), name, progress=progress)
        if request.save_trace is not None:
            write_trace(request.save_trace, c, overwrite=request.force)
            say(f"candidate trace written to {request.save_trace}")
        own, where = pin_own_doctrine(pin)
    pin_doctrine = resolve_doctrine(own, source=f"the pin's ({where})") if own is not None else None
    return calibrate(o, c, dtype=request.dtype, pin_doctrine=pin_doctrine)
