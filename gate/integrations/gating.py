"""One call from a candidate to a verdict, for the integrations: a candidate trace (a path
or a `Trace`) or a loaded engine of the plugin contract (`gate.core.engine.Engine`),
gated against the pin with the functions `gate run` uses (`gate.workflows.run.core`): the pin
loaded and checked as `gate run` loads it, the pin's own doctrine with the caller's
per-field overrides, the same adjudication. No second pipeline.
"""

from __future__ import annotations

import os
from pathlib import Path

from gate.core.engine import CONTRACT_METHODS, Engine, check_contract, lacking_methods
from gate.core.pins.pin import doctrine_for, load_pin
from gate.core.traces.reader import read_trace
from gate.core.traces.trace import Trace
from gate.core.verdict.doctrine import apply_overrides
from gate.core.verdict.result import DEFECT, RATIFIED_PASS, GateResult
from gate.errors import InputError
from gate.reports._common import VERDICT_LABELS, why
from gate.workflows.common.engine_calls import engine_name
from gate.workflows.common.requests import DoctrineFlags
from gate.workflows.run.core import RunOutcome, gate_against_pin, gate_trace_against_pin

Candidate = str | os.PathLike[str] | Trace | Engine


# The doctrine flags of `gate run`, each changing its own field of the pin's doctrine: the
# workflows' one record of them, under the name the fixture and the action use.
Overrides = DoctrineFlags


def default_model() -> str:
    from gate.models.default import DEFAULT_MODEL

    return DEFAULT_MODEL


def gate_candidate(
    candidate: Candidate,
    *,
    model: str | None = None,
    pins_dir: str | os.PathLike[str] | None = None,
    strict: bool = False,
    overrides: Overrides | None = None,
) -> RunOutcome:
    """Gate `candidate` against the pin of `model` (default: gate's default model), as `gate
    run` (or `gate run --candidate-trace`) would. The pin is the one the caller names, never
    the one a trace's header names: a trace for another model is refused (PinError, exit 2)
    by the provenance check, so a candidate cannot choose a lax pin from `pins_dir`.

    An engine is driven but not closed: whoever loaded it owns it. Raises the `GateError`
    `gate run` would raise (a bad trace, no pin, an engine failure)."""
    flags = (overrides or Overrides()).overrides()
    apply_overrides({}, flags)  # a bad threshold fails before any work
    pins = Path(pins_dir) if pins_dir is not None else None
    if isinstance(candidate, str | os.PathLike):
        candidate = read_trace(candidate, role="candidate")
    if isinstance(candidate, Trace):
        if candidate.role != "candidate":
            raise InputError(f"{candidate.path}: expected a candidate trace, found role {candidate.role!r}")
        pin = load_pin(model or default_model(), pins)
        return gate_trace_against_pin(pin, candidate, doctrine_for(pin, flags, strict=strict))
    if len(lacking_methods(candidate)) < len(CONTRACT_METHODS):  # an engine, whole or not
        check_contract(candidate, repr(engine_name(candidate)))
        pin = load_pin(model or default_model(), pins)
        return gate_against_pin(candidate, pin, doctrine_for(pin, flags, strict=strict))
    raise InputError(
        f"gate_check: the candidate is a {type(candidate).__name__}: expected a candidate trace (a path or a "
        "gate Trace) or an engine of the plugin contract (gate.core.engine.Engine)"
    )


def passed(result: GateResult) -> bool:
    """The verdict is a pass under the doctrine the result was judged by (`gate run` exit 0)."""
    return result.exit_code == 0


def failure_reason(result: GateResult) -> str:
    """One line: why the verdict is not a pass, from the fields that decided it; a run that
    fails both by its prompts and by its distribution names both."""
    verdict = VERDICT_LABELS.get(result.verdict, result.verdict)
    causes: list[str] = []
    defects = [d for d in result.divergences if d.cls == DEFECT]
    unratified = [p.id for p in result.prompts if not p.ratified]
    if defects:
        d = defects[0]
        more = f" (and {len(defects) - 1} more)" if len(defects) > 1 else ""
        first = "first divergence not judged for want of evidence" if d.want_of_evidence else "first defect"
        causes.append(
            f"{first} at prompt {d.prompt_id!r} position {d.position} (oracle token {d.oracle_token}, "
            f"candidate token {d.candidate_token}){more}: {why(d, result.doctrine, with_rule=False)}"
        )
    elif unratified:
        causes.append(f"{len(unratified)} prompt(s) not ratified: {', '.join(map(repr, unratified[:5]))}")
    dist = result.distribution
    if dist is not None and dist.beyond:
        causes.append(f"numerics beyond honest drift: {'; '.join(dist.beyond_figures)}")
    elif dist is not None and dist.disagrees and dist.free_forced is not None:
        causes.append(f"free run and forced decode disagree: {'; '.join(dist.free_forced.beyond_figures)}")
    if causes:
        return f"{verdict}: " + "; and ".join(causes)
    if result.verdict == RATIFIED_PASS and result.doctrine.strict:
        diverged = [p.id for p in result.prompts if not p.strict]
        return (
            f"{verdict} under strict: {len(diverged)} prompt(s) diverge only by ties, which strict does not "
            f"allow: {', '.join(map(repr, diverged[:5]))}"
        )
    return f"{verdict} (exit {result.exit_code})"


def gate_engine_named(
    engine: str,
    options: dict[str, str] | None = None,
    *,
    model: str | None = None,
    model_path: str | None = None,
    pins_dir: str | os.PathLike[str] | None = None,
    strict: bool = False,
    overrides: Overrides | None = None,
) -> RunOutcome:
    """Load the engine `engine` (a built-in name, an entry point or `module:Class`) for the
    pin's model (or the weights at `model_path`), gate it as `gate run --engine` does, close it."""
    from gate.engines.registry import load_engine
    from gate.workflows.common.engine_calls import open_engine

    flags = (overrides or Overrides()).overrides()
    apply_overrides({}, flags)
    pin = load_pin(model or default_model(), Path(pins_dir) if pins_dir is not None else None)
    doctrine = doctrine_for(pin, flags, strict=strict)
    with open_engine(lambda: load_engine(engine, model_path or pin.model, options or {}), engine) as loaded:
        return gate_against_pin(loaded, pin, doctrine)
