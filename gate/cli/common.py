"""Helpers shared by the commands: engine options, the stderr console, the progress bar."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from gate.errors import InputError

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress

    from gate.core.engine import Engine
    from gate.core.pins.pin import Pin


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


def parse_engine_opts(pairs: Sequence[str] | None) -> dict[str, str]:
    """`["k=v", ...]` to a dict; a pair without `=` is an input error."""
    out: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--engine-opt {pair!r}: expected key=value")
        out[key.strip()] = value
    return out


def doctrine_overrides(
    near_tie_mnats: float | None = None, near_tie_ulps: float | None = None, no_evidence: bool = False
) -> dict[str, Any]:
    """The doctrine flags a command was given, as per-field overrides of the pin's doctrine
    (`gate.core.verdict.doctrine.resolve_doctrine`): each flag changes its own field only."""
    out: dict[str, Any] = {}
    if near_tie_mnats is not None:
        out["near_tie_mnats"] = near_tie_mnats
    if near_tie_ulps is not None:
        out["near_tie_ulps"] = near_tie_ulps
    if no_evidence:
        out["evidence"] = None
    return out


class ProgressBar:
    """A workflow's progress (`gate.workflows.progress.Progress`) drawn as one rich progress bar on stderr."""

    def __init__(self, progress: RichProgress) -> None:
        self._progress = progress
        self._task: Any = None

    def phase(self, name: str, total: int) -> None:
        if self._task is not None:
            self._progress.stop_task(self._task)
        self._task = self._progress.add_task(name, total=total) if total else None

    def advance(self, n: int = 1) -> None:
        if self._task is not None:
            self._progress.advance(self._task, n)


def progress_bar() -> RichProgress:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description:>9}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("prompts"),
        TimeElapsedColumn(),
        console=stderr_console(),
    )


def default_model() -> str:
    from gate.models.default import DEFAULT_MODEL

    return DEFAULT_MODEL


def load_engine_for(engine_name: str, pin: Pin, opts: dict[str, str], model_path: Path | None) -> Callable[[], Engine]:
    """What builds the candidate engine: `--model-path` if given, else the pin's model."""

    def load() -> Engine:
        from gate.engines.registry import load_engine

        return load_engine(engine_name, str(model_path) if model_path is not None else pin.model, opts)

    return load
