"""What a step says to the GitHub Actions runner, built so that no text from a trace, an
input, a path or a server ever becomes a command of its own.

The runner reads every line a step prints, stdout and stderr alike, for workflow commands:
`::name props::data` at the start of a line (after spaces), and the legacy
`##[name props]data` anywhere in a line; it breaks lines at `\\n` and at `\\r`
(actions/runner: `ActionCommand.TryParseV2`, `ActionCommand.TryParse`). So:

- `escape_data` and `escape_property` are @actions/core's (`%` → `%25`, `\\r` → `%0D`,
  `\\n` → `%0A`; a property also `:` → `%3A`, `,` → `%2C`): an annotation is one line,
  whatever its text, and the runner shows the text back whole;
- `RunnerLog.say` prints a plain line the same way, with the legacy `##[` broken too;
- under the runner (GITHUB_ACTIONS=true), `runner_log` brackets the whole step between
  `::stop-commands::TOKEN` and `::TOKEN::` (a random token no text can guess), so what gate,
  an engine or a library prints meanwhile (a warning that quotes a server's answer) is
  never a command; the step's own annotations are printed after the bracket;
- `write_outputs` writes GITHUB_OUTPUT as @actions/core does: `name=value`, or a
  `name<<DELIMITER` block (a random delimiter) for a value with a line break.
"""

from __future__ import annotations

import os
import secrets
import sys
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from gate.errors import InputError


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


@dataclass
class RunnerLog:
    """The step's lines: plain ones printed at once (stderr), annotations kept for the end."""

    annotations: list[str] = field(default_factory=list)

    def say(self, text: str) -> None:
        print(escape_data(text).replace("##[", "#%23["), file=sys.stderr, flush=True)

    def error(self, message: str, **properties: str | int | None) -> None:
        """An `::error` annotation; `properties` (file, line, title) as the runner takes them."""
        props = ",".join(f"{k}={escape_property(str(v))}" for k, v in properties.items() if v is not None)
        self.annotations.append(f"::error{' ' + props if props else ''}::{escape_data(message)}")


@contextmanager
def runner_log(env: Mapping[str, str]) -> Iterator[RunnerLog]:
    """A `RunnerLog` for the step; under the runner, no command is read from anything the
    step prints until it ends, and then only its own annotations."""
    log = RunnerLog()
    token = secrets.token_hex(16) if env.get("GITHUB_ACTIONS") == "true" else None
    if token is not None:
        # One pipe for both streams: the runner reads stdout and stderr apart, so a line on
        # stdout could be read before the stop on stderr, or after the resume.
        sys.stdout.flush()
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
        print(f"::stop-commands::{token}", file=sys.stderr, flush=True)
    try:
        yield log
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        if token is not None:
            print(f"::{token}::", file=sys.stderr, flush=True)
        for line in log.annotations:
            print(line, file=sys.stderr, flush=True)


def output_lines(values: Mapping[str, object]) -> list[str]:
    """GITHUB_OUTPUT's lines for `values`: `name=value`, or a heredoc block for a value that
    holds a line break (`\\n` or `\\r`) under a delimiter it does not contain."""
    lines = []
    for name, value in values.items():
        text = "" if value is None else str(value)
        if "\n" not in text and "\r" not in text:
            lines.append(f"{name}={text}\n")
            continue
        delimiter = f"ghadelimiter_{uuid.uuid4()}"
        if delimiter in text:  # a random UUID: never, but never trust it either
            raise InputError(f"output {name}: its value holds the delimiter {delimiter}")
        lines.append(f"{name}<<{delimiter}\n{text}\n{delimiter}\n")
    return lines


def write_outputs(values: Mapping[str, object], env: Mapping[str, str]) -> None:
    """Append `values` to GITHUB_OUTPUT (stdout when it is not set); a GITHUB_OUTPUT that
    cannot take them is an InputError naming it."""
    lines = output_lines(values)
    target = env.get("GITHUB_OUTPUT")
    if not target:
        sys.stdout.writelines(lines)
        sys.stdout.flush()
        return
    from gate.core.storage.atomic import append_regular

    try:
        append_regular(target, "".join(lines))
    except OSError as exc:
        raise InputError(f"GITHUB_OUTPUT {target}: cannot be written: {exc.strerror or exc}") from None
