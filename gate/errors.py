"""One error hierarchy, mapped to the spec's exit codes in exactly one place (`exit_code`)."""

from __future__ import annotations


class GateError(Exception):
    """Base of every error gate reports to a person. `exit_code` follows the spec."""

    exit_code: int = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        # One line each: the message, and the command to run next (printed as `hint: ...`
        # on a line of its own), never a newline inside either.
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class InputError(GateError):
    """Bad arguments, unreadable or invalid files, prompt mismatch (exit 2)."""

    exit_code = 2


class TraceError(InputError):
    """A trace file that breaks format v1; names the file, line and field."""

    def __init__(self, path: str, line: int | None, field: str | None, problem: str) -> None:
        where = path if line is None else f"{path}:{line}"
        what = f"field '{field}': {problem}" if field else problem
        super().__init__(f"{where}: {what}")
        self.path = path
        self.line = line
        self.field = field
        self.problem = problem


class PinError(InputError):
    """A missing pin, or a pin whose provenance does not match the candidate (exit 2)."""

    exit_code = 2


class EngineError(GateError):
    """The engine crashed, a server did not answer, out of memory (exit 3)."""

    exit_code = 3


class UnsupportedArchitecture(EngineError):
    """An engine that cannot run a checkpoint's architecture here (exit 3), said in one line
    naming both, before any long work."""

    def __init__(self, engine: str, architecture: str, why: str) -> None:
        super().__init__(f"engine {engine!r} cannot run the architecture {architecture} here: {why}")
        self.engine = engine
        self.architecture = architecture


# An exception that is no GateError reached the command line: a bug in gate itself, not
# bad input (2) and not the engine (3: an engine's own failures are EngineErrors, wrapped
# where gate calls into it, `gate.workflows.common.engine_calls`). An addition to the spec's codes.
INTERNAL_ERROR_EXIT = 4


class Interrupted(GateError):
    """Ctrl-C: the partial report is printed and the run exits 130."""

    exit_code = 130
