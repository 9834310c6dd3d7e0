"""The `gate` command. Thin: options are parsed here and handed to plain functions.

Error handling lives in one place, `main()`: a GateError prints one line on stderr and
exits with its code (spec: 2 input, 3 engine); no traceback unless GATE_DEBUG=1.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import typer

from gate import __version__
from gate.errors import GateError

app = typer.Typer(
    name="gate",
    help="A token-exact gate for LLM inference engines: greedy outputs against a pinned vLLM oracle.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

# Each module defines `register(app)`; commands import their heavy dependencies lazily.
COMMAND_MODULES = ("compare", "run", "pin", "goldens", "doctrine", "shards")
for _name in COMMAND_MODULES:
    importlib.import_module(f"gate.cli.{_name}").register(app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gate {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    """gate compares a candidate engine's greedy tokens with a pinned vLLM oracle, position by position."""


def _debug() -> bool:
    return os.environ.get("GATE_DEBUG", "") not in ("", "0")


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv, prog_name="gate")
    except GateError as exc:
        if _debug():
            traceback.print_exc()
        print(f"gate: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("gate: interrupted", file=sys.stderr)
        sys.exit(130)
    except MemoryError as exc:
        if _debug():
            traceback.print_exc()
        print(f"gate: error: out of memory: {exc}", file=sys.stderr)
        sys.exit(3)
    except Exception as exc:
        if _debug():
            traceback.print_exc()
        print(
            f"gate: internal error: {type(exc).__name__}: {exc} (set GATE_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        sys.exit(3)
