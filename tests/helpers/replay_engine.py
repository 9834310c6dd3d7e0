"""An engine that replays a candidate trace file: its free run is the trace's records, its
`info()` the trace header's engine fields. A trace judged as a file and the same trace
replayed through `gate run --engine` or `gate.run` must get one verdict and one report
(tests/api/test_doors.py). It cannot force: a trace that diverges needs a real engine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gate.core.engine import PromptInput
from gate.core.traces.reader import read_trace
from gate.core.traces.trace import PromptRecord


class ReplayEngine:
    name = "replay"

    def __init__(self, model: str, *, trace: str = "", **_options: Any) -> None:
        self._trace = read_trace(trace, role="candidate")
        self._records = self._trace.by_id()

    def info(self) -> dict[str, Any]:
        header = self._trace.header
        return {**header.extra, **header.engine}

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        return [self._records[p.id] for p in prompts]

    def encode(self, text: str | None = None, messages: Sequence[Mapping[str, str]] | None = None) -> None:
        return None  # runs on the pinned prompt ids

    def decode_tokens(self, ids: Sequence[int]) -> None:
        return None

    def close(self) -> None:
        pass
