"""The one judging function every door calls: `gate compare`, `gate run` (an engine or
`--candidate-trace`), `gate.compare`, `gate.run`, the pytest fixture and the Action.

A judgement is the adjudication of the core (`gate.core.verdict.adjudicate.compare`) with
the divergences after a routing flip attributed (`attribute_routing`), under the oracle's
own doctrine unless the caller passes one: the doctrine an oracle trace's header carries
(a pin's does), so that a trace judged from Python, the CLI or CI gets one verdict and one
report. Nothing here prints; paths are read as trace files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gate.core.traces.reader import read_trace
from gate.core.traces.trace import Trace
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.doctrine import Doctrine, header_doctrine, resolve_doctrine
from gate.core.verdict.result import GateResult
from gate.core.verdict.routing import attribute_routing

TraceSource = str | os.PathLike[str] | Trace
ACCEPTED = "a trace file's path (str or os.PathLike) or a gate.Trace"


def as_trace(source: object, role: str, parameter: str, caller: str = "gate.compare") -> Trace:
    """`source` as a trace of `role`: a path is read (and its role checked), a `Trace` taken
    as it is; anything else is a TypeError naming `parameter` and what is accepted."""
    if isinstance(source, Trace):
        return source
    if isinstance(source, str | os.PathLike):
        return read_trace(source, role=role)
    raise TypeError(f"{caller}: {parameter} is a {type(source).__name__}: expected {ACCEPTED}")


def oracle_doctrine(oracle: Trace, overrides: Mapping[str, Any] | None = None, *, strict: bool = False) -> Doctrine:
    """The doctrine the oracle trace's header carries (a pin's does; the `Doctrine` defaults
    when it carries none), each override changing its own field (`resolve_doctrine`)."""
    where = str(oracle.path)
    return resolve_doctrine(
        header_doctrine(oracle.header.extra, where),
        overrides,
        strict=strict,
        source=f"the oracle trace's header ({where})",
    )


def judge(oracle: TraceSource, candidate: TraceSource, doctrine: Doctrine | None = None) -> GateResult:
    """Adjudicate `candidate` against `oracle` (each a trace file's path or a `Trace`) under
    `doctrine`, by default the oracle's own (`oracle_doctrine`). InputError (exit 2) for a
    trace of the wrong role or prompts that do not match; TypeError for an argument that is
    neither a path nor a trace."""
    o = as_trace(oracle, "oracle", "oracle")
    c = as_trace(candidate, "candidate", "candidate")
    if doctrine is not None and not isinstance(doctrine, Doctrine):
        raise TypeError(f"gate.compare: doctrine is a {type(doctrine).__name__}: expected a gate.Doctrine or None")
    chosen = doctrine if doctrine is not None else oracle_doctrine(o)
    return attribute_routing(compare(o, c, chosen), o, c)
