"""What ran to give a `GateResult`, beyond the two traces: the command, the pin, both
engines, the timings, and whether the report covers only part of the suite (a shard, or
a run interrupted by Ctrl-C). The JSON report of a partial run carries it under the key
`meta`; a complete run's report is the same however it was run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Interruption:
    """A run stopped by Ctrl-C: the report covers `prompts_done` of `prompts_total`."""

    prompts_done: int
    prompts_total: int

    def to_dict(self) -> dict[str, int]:
        return {"prompts_done": self.prompts_done, "prompts_total": self.prompts_total}


@dataclass(frozen=True, slots=True)
class RunRecord:
    command: str
    pin: str
    pin_created_at: str | None = None
    oracle: Mapping[str, Any] = field(default_factory=dict)
    candidate: Mapping[str, Any] = field(default_factory=dict)
    forced_prompts: tuple[str, ...] = ()
    timings: Mapping[str, float] = field(default_factory=dict)
    shard: str | None = None  # "K/N" when the run covered one shard of the suite
    repeats: int | None = None  # N when `--repeat N` (N > 1) found the engine deterministic
    interrupted: Interruption | None = None
    # Where the pin was recorded and where the candidate ran: machine keys (`gate.core.traces.machine`).
    machine: Mapping[str, Any] = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        """The report covers part of the suite: a shard, or an interrupted run."""
        return self.shard is not None or self.interrupted is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "pin": self.pin,
            "pin_created_at": self.pin_created_at,
            "oracle": dict(self.oracle),
            "candidate": dict(self.candidate),
            "forced_prompts": list(self.forced_prompts),
            "timings": dict(self.timings),
            "shard": self.shard,
            "repeats": self.repeats,
            "interrupted": self.interrupted.to_dict() if self.interrupted is not None else None,
            "partial": self.partial,
            "machine": dict(self.machine),
        }
