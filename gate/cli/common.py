"""What the commands share besides their options: the typer app whose help shows flags as
flags, the stderr console and the progress bar."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from typer.core import TyperArgument, TyperCommand, TyperGroup

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress


# Stands in an option's help for the built-in engines' names, filled in from the registry
# when the help is shown.
BUILTIN_ENGINES = "<the built-in engines>"


class _FlagsAsFlags:
    """Help that shows an on/off option as the flag it is (`--strict`, `--floor/--no-floor`):
    typer would print `<bool>` beside it, as if it took a value. And help that names the
    built-in engines names them from the registry (`BUILTIN_ENGINES`)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        for param in self.get_params(ctx):  # type: ignore[attr-defined]
            if getattr(param, "is_bool_flag", False) and param.metavar is None:
                param.metavar = ""  # the type column shows the metavar when there is one
            text = getattr(param, "help", None)
            if text and BUILTIN_ENGINES in text:
                from gate.engines.registry import BUILTIN

                param.help = text.replace(BUILTIN_ENGINES, ", ".join(BUILTIN))
        super().format_help(ctx, formatter)  # type: ignore[misc]


class Command(_FlagsAsFlags, TyperCommand):
    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """The usage line names arguments by their metavars, as the help's panel does:
        `gate compare [OPTIONS] ORACLE CANDIDATE` (typer would write `{ORACLE}`), an
        optional one in brackets, a repeated one with `...`."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = param.display_name_raw
                if param.nargs != 1 and not name.endswith("..."):
                    name += "..."
                pieces.append(name if param.required else f"[{name}]")
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces


class Group(_FlagsAsFlags, TyperGroup):
    pass


class App(typer.Typer):
    """`typer.Typer` whose commands and groups are `Command` and `Group`: every `gate` app."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=Group, **kwargs)

    def command(
        self, name: str | None = None, *, cls: type[TyperCommand] | None = None, **kwargs: Any
    ) -> Callable[[Any], Any]:
        return super().command(name, cls=cls or Command, **kwargs)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


class ProgressBar:
    """A workflow's progress (`gate.workflows.common.progress.Progress`) drawn as one rich progress bar on stderr."""

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
