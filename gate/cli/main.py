"""The `gate` command. Thin: options are parsed here and handed to plain functions.

Error handling lives in one place, `main()`: a GateError prints one line on stderr and
exits with its code (spec: 2 input, 3 engine); any other exception is a bug in gate
(exit 4, `INTERNAL_ERROR_EXIT`); no traceback unless GATE_DEBUG=1. Typer
runs without its standalone mode, so its usage errors come here too (one line, exit 2)
and so does Ctrl-C (a line, exit 130).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import typer

from gate.cli.common import App
from gate.errors import INTERNAL_ERROR_EXIT, GateError
from gate.text import printable
from gate.version import __version__

app = App(
    name="gate",
    help="A token-exact gate for LLM inference engines: greedy outputs against a pinned vLLM oracle.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

# Each module defines `register(app)`; commands import their heavy dependencies lazily.
COMMAND_MODULES = (
    "compare",
    "run",
    "export_prompts",
    "pin",
    "goldens",
    "calibrate",
    "selftest",
    "merge",
    "diagnose",
    "invariance",
    "diff",
)
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


def _say(line: str) -> None:
    """One line on stderr, whatever the message holds (a path with a newline, an escape)."""
    print(printable(line), file=sys.stderr)


INTERRUPTED = "gate: interrupted (Ctrl-C)"


def _usage_error(exc: typer.TyperException) -> int:
    """Typer's refusals of the command line, as one line (not its five-line box)."""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError":  # bare `gate`: the help is the answer
        print(exc.format_message(), file=sys.stderr)
        return 2
    command = ctx.command_path if ctx is not None else "gate"
    message = " ".join(exc.format_message().split())
    _say(f"gate: error: {command}: {message} (see '{command} --help')")
    code = getattr(exc, "exit_code", 2)
    return code if isinstance(code, int) and code else 2


def main(argv: list[str] | None = None) -> None:
    try:
        code = app(args=argv, prog_name="gate", standalone_mode=False)
    except GateError as exc:
        if _debug():
            traceback.print_exc()
        _say(f"gate: error: {exc}")
        if exc.hint:
            _say(f"hint: {exc.hint}")
        sys.exit(exc.exit_code)
    except typer.TyperException as exc:
        sys.exit(_usage_error(exc))
    except (KeyboardInterrupt, typer.Abort):
        _say(INTERRUPTED)
        sys.exit(130)
    except MemoryError as exc:
        if _debug():
            traceback.print_exc()
        _say(f"gate: error: out of memory: {exc}")
        sys.exit(3)
    except Exception as exc:
        if _debug():
            traceback.print_exc()
        # Not an engine failure (those arrive as EngineError, exit 3): a bug in gate.
        _say(f"gate: internal error (a bug in gate, please report it): {type(exc).__name__}: {exc}")
        if not _debug():
            _say("hint: set GATE_DEBUG=1 for the traceback")
        sys.exit(INTERNAL_ERROR_EXIT)
    if code == 130:
        # Typer turns a KeyboardInterrupt in a command into exit 130 before we see it; no
        # gate command returns 130 itself (a GateError `Interrupted` carries its message).
        _say(INTERRUPTED)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
