"""Two trace files adjudicated (`gate compare ORACLE CANDIDATE`): no model, engine or torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gate.core.traces.reader import read_trace
from gate.core.verdict.result import GateResult
from gate.workflows.common.requests import DoctrineFlags
from gate.workflows.run.judge import judge, oracle_doctrine


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
    # same verdict as `gate run` and `gate.compare`.
    return judge(o, c, oracle_doctrine(o, request.doctrine.overrides(), strict=request.strict))
