"""Two trace files adjudicated (`gate compare ORACLE CANDIDATE`): no model, engine or torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gate.core.traces.reader import read_trace
from gate.core.verdict.adjudicate import compare
from gate.core.verdict.doctrine import header_doctrine, resolve_doctrine
from gate.core.verdict.result import GateResult
from gate.core.verdict.routing import attribute_routing
from gate.workflows.requests import DoctrineFlags


@dataclass(frozen=True, slots=True)
class CompareRequest:
    oracle: Path
    candidate: Path
    doctrine: DoctrineFlags = field(default_factory=DoctrineFlags)
    strict: bool = False


def compare_traces(request: CompareRequest) -> GateResult:
    o = read_trace(request.oracle, role="oracle")
    c = read_trace(request.candidate, role="candidate")
    # The doctrine an oracle trace carries in its header (a pin's does) travels with it: the
    # same verdict as `gate run`.
    doctrine = resolve_doctrine(
        header_doctrine(o.header.extra, str(request.oracle)),
        request.doctrine.overrides(),
        strict=request.strict,
        source=f"the oracle trace's header ({request.oracle})",
    )
    return attribute_routing(compare(o, c, doctrine), o, c)
