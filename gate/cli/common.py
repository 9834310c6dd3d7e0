"""What the commands share besides their options: the stderr console and the progress bar."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


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


@contextmanager
def progress_display() -> Iterator[ProgressBar]:
    """The progress bar on stderr for the length of one stage (a workflow's `ProgressDisplay`)."""
    with progress_bar() as bar:
        yield ProgressBar(bar)
