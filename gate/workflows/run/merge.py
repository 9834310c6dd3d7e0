"""Shard traces merged into one (`gate merge`): no overlaps, no gaps, one provenance, and,
when asked, exactly the prompts of a pin's suite or of an oracle trace."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gate.core.pins.oracle_settings import read_settings
from gate.core.pins.pin import find_folder, load_suite
from gate.core.traces.reader import read_trace
from gate.core.traces.shards import merge_traces
from gate.core.traces.trace import Trace
from gate.errors import InputError, PinError


@dataclass(frozen=True, slots=True)
class MergeRequest:
    """The shards, and what they must cover: a model's pinned suite (`--model`) or an oracle
    trace's prompts (`--expect-ids-from`), else whatever the shards hold, without gaps."""

    shards: tuple[Path, ...]
    pin_model: str | None = None
    expect_ids_from: Path | None = None
    pins_dir: Path | None = None

    def check(self) -> None:
        if self.pin_model is not None and self.expect_ids_from is not None:
            raise InputError("--model and --expect-ids-from both name the expected prompts: give one")


@dataclass(frozen=True, slots=True)
class Merged:
    trace: Trace
    shards: int


def merge_shards(request: MergeRequest) -> Merged:
    request.check()
    traces = [read_trace(p) for p in request.shards]
    expected: tuple[str, ...] | None = None
    source = "the suite"
    model = traces[0].header.model
    if request.expect_ids_from is not None:
        oracle = read_trace(request.expect_ids_from, role="oracle")
        expected, source = tuple(r.id for r in oracle.records), f"the oracle trace {request.expect_ids_from}"
        if oracle.header.model != model:
            raise InputError(
                f"{request.expect_ids_from} is an oracle for {oracle.header.model!r}, the shards are for {model!r}"
            )
    elif request.pin_model is not None:
        pin_model = request.pin_model
        folder = find_folder(pin_model, request.pins_dir)
        suite = load_suite(folder, read_settings(folder.settings_path))
        expected, source = suite.ids, f"the pin's suite {folder.suite_path}"
        if model != pin_model:
            raise PinError(f"the shards are for model {model!r}, not {pin_model!r}")
        ran = traces[0].header.extra.get("pin_suite_sha256")
        if ran is not None and ran != suite.sha256:
            raise PinError(
                f"the shards ran the suite with hash {ran}, but {folder.suite_path} now hashes to {suite.sha256}: "
                "the suite changed since; rerun the shards"
            )
    return Merged(trace=merge_traces(traces, expected, expected_from=source), shards=len(traces))
