"""The one output sink of every command.

The rule, the same for all:
- stdout carries the data and nothing else: the report (or the trace, the prompts, the
  pin's JSON), unless `--output FILE` takes it (`-o -` means stdout).
- stderr carries everything addressed to a person: progress, notes, warnings, errors,
  and the summary line whenever the person would not otherwise see it: the report went
  to a file, or it is in a machine format after a run that drove an engine (its progress
  is on stderr anyway). A command that only reads files and prints its report on stdout
  prints nothing else, so `gate compare ... --format json 2>&1 | jq` parses: the report
  carries the summary itself.
- In a GitHub Actions job (`GITHUB_STEP_SUMMARY` set) the job summary gets the report once,
  here: the Markdown report, where the result has one, is appended to it; or, when
  `--output` names the job summary itself, the report asked for is appended there instead
  (never replaced: no --force needed) and nothing more.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gate.core.storage.atomic import (
    REPORT,
    append_problem,
    append_regular,
    atomic_write,
    check_target,
    file_kind,
    same_file,
)
from gate.errors import InputError

if TYPE_CHECKING:
    from gate.reports import Reportable

STDOUT = Path("-")


def to_stdout(output: Path | None) -> bool:
    return output is None or output == STDOUT


def say(*lines: str) -> None:
    """Lines for the person watching: stderr."""
    for line in lines:
        print(line, file=sys.stderr)


Target = tuple[Path | None, str] | tuple[Path | None, str, str]


def refuse_overwrite(
    force: bool,
    *targets: Target,
    message: str = "{flag}{path}: already exists; pass --force to replace it",
    error: type[InputError] = InputError,
    inputs: Sequence[Path | None] = (),
) -> None:
    """Refuse, before any work, to replace a file the command would write (unless --force),
    and, --force or not, to write over one of the command's `inputs`, over a file of another
    kind than it writes, or to send two outputs to one file (`check_target`, by file
    identity: a symlink or a hard link to an input is that input).

    `targets` are (path, flag) pairs, or (path, flag, kind) where the file is not a report
    (`gate.core.storage.atomic`'s kinds); `message` may name `{flag}` and `{path}`."""
    refuse_input_as_output(targets, inputs)
    if any(len(t) == 2 and t[1] == "--output" for t in targets):  # a report: its Markdown goes to the summary too
        refuse_step_summary(inputs)
    for target in targets:
        path, flag = target[0], target[1]
        kind = target[2] if len(target) > 2 else REPORT
        if path is None or to_stdout(path):
            continue
        if flag == "--output" and is_step_summary(path):
            continue  # the job summary: appended to, not replaced
        check_target(path, kind, force=force, flag=flag, message=message, error=error)


def refuse_input_as_output(targets: Sequence[Target], inputs: Sequence[Path | None]) -> None:
    """An output that is one of the inputs (or another output) is refused, exit 2, before
    anything is read or written: `gate compare O C -o O --force` must never replace O."""
    outputs = [(t[0], t[1]) for t in targets if t[0] is not None and not to_stdout(t[0])]
    for n, (path, flag) in enumerate(outputs):
        assert path is not None
        name = f"{flag} {path}" if flag else str(path)
        hit = same_file(path, [i for i in inputs if i is not None and not to_stdout(i)])
        if hit is not None:
            raise InputError(f"{name}: is the input {hit} (the same file); an input is never its own output")
        other = same_file(path, [p for p, _ in outputs[:n]])
        if other is not None:
            raise InputError(f"{name}: is also where another output goes ({other}); give each output its own file")


def refuse_step_summary(inputs: Sequence[Path | None] = ()) -> None:
    """The job summary (`GITHUB_STEP_SUMMARY`, when set) is appended to: like any output it
    is never one of the command's `inputs` (by identity) and never a gate data file (a pin,
    a golden, a trace, a prompt list, oracle.json: `file_kind`). Exit 2, before any work.
    A summary that cannot be appended to (a directory, a FIFO: `append_text` never waits
    on one) is a warning at the append, and the verdict stands."""
    target = step_summary()
    if target is None:
        return
    name = f"GITHUB_STEP_SUMMARY {target}"
    hit = same_file(target, [i for i in inputs if i is not None and not to_stdout(i)])
    if hit is not None:
        raise InputError(f"{name}: is the input {hit} (the same file); the job summary is appended to, an input never")
    kind = file_kind(target)  # None for anything but a regular file: the append warns
    if kind is not None and kind != REPORT:
        raise InputError(f"{name}: {append_problem(target)}")


def pin_inputs(model: str, pins_dir: Path | None) -> tuple[Path, ...]:
    """The files of `model`'s pin (none when there is no pin: that error comes later, in
    its own words): inputs of every command that judges against the pin."""
    from gate.core.pins.pin import find_folder
    from gate.errors import GateError

    try:
        folder = find_folder(model, pins_dir)
    except GateError:
        return ()
    return (folder.pin_path, folder.suite_path, folder.settings_path)


def write_data(data: bytes, output: Path | None, *, force: bool = False, backup: bool = False) -> Path | None:
    """Data to `output` atomically (returns the backup kept, if any), or to stdout."""
    if to_stdout(output):
        buffer = getattr(sys.stdout, "buffer", None)
        if buffer is None:  # a text stream standing in for stdout (a test's StringIO)
            sys.stdout.write(data.decode("utf-8"))
        else:
            sys.stdout.flush()
            buffer.write(data)
        sys.stdout.flush()
        return None
    assert output is not None
    return atomic_write(output, data, overwrite=force, backup=backup)


def emit(
    result: Reportable,
    fmt: str,
    output: Path | None = None,
    *,
    force: bool = False,
    engine_ran: bool = False,
    details: bool = False,
) -> None:
    """Render `result` in `fmt` and send it where the rule above says (`details`: with the
    report's details section, where it has one)."""
    from gate.reports import print_rich, render

    if fmt == "rich" and to_stdout(output) and sys.stdout.isatty():
        from rich.console import Console

        print_rich(result, Console(highlight=False, soft_wrap=False), details=details)
    else:  # a file or a pipe: the width COLUMNS says (else 100), no colour codes
        text = render(result, fmt, details=details, width=text_width())
        if not text.endswith("\n") and (to_stdout(output) or is_step_summary(output)):
            text += "\n"
        if output is not None and is_step_summary(output):
            # The job summary is appended to, as GitHub documents it: the report goes there
            # once, in the format asked, and nothing else is appended after it.
            append_text(text, output, "--output")
        else:
            write_data(text.encode("utf-8"), output, force=force)
    if not to_stdout(output):
        say(result.summary, f"report written to {output}")
    elif fmt != "rich" and engine_ran:
        say(result.summary)
    if not is_step_summary(output):
        append_step_summary(result)


# A text report narrower than this cannot hold its panels' labels beside their values.
MIN_TEXT_WIDTH = 40


def text_width() -> int | None:
    """The width of a text report sent to a pipe or a file: `COLUMNS` when it is a whole
    number (at least MIN_TEXT_WIDTH; at most 1,000), as rich reads it for a terminal; else
    None, the renderer's own default (100 columns)."""
    raw = os.environ.get("COLUMNS", "").strip()
    if not raw.isdigit():
        return None
    return min(max(int(raw), MIN_TEXT_WIDTH), 1000)


def step_summary() -> Path | None:
    """GitHub Actions' job summary file (`GITHUB_STEP_SUMMARY`), when set."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    return Path(target) if target else None


def is_step_summary(output: Path | None) -> bool:
    """`output` is the job summary itself (by path, or by file identity)."""
    target = step_summary()
    if target is None or output is None or to_stdout(output):
        return False
    if os.path.abspath(output) == os.path.abspath(target):
        return True
    return same_file(output, [target]) is not None


def append_text(text: str, target: Path, what: str) -> bool:
    """Append `text` to `target`; a failure is a warning (the verdict and exit code stand).

    Checked again at the append (`append_problem`: checked before any work, but the file
    may have changed since), and opened without blocking: a FIFO is never waited on."""
    problem = append_problem(target)
    if problem is not None:
        say(f"gate: warning: cannot append to {what} {target}: {problem}")
        return False
    try:
        append_regular(target, text)
    except OSError as exc:
        say(f"gate: warning: cannot append to {what} {target}: {exc.strerror or exc}")
        return False
    return True


def append_step_summary(result: Reportable) -> None:
    """In a GitHub Actions job, append the Markdown report to the job summary, whatever the
    format asked for (unless `--output` named the summary itself: `emit` wrote it there)."""
    from gate.reports import has_format, render

    target = step_summary()
    if target is None or not has_format(result, "markdown"):
        return
    append_text(render(result, "markdown") + "\n", target, "GITHUB_STEP_SUMMARY")
