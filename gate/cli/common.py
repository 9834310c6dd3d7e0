"""Helpers shared by the commands: engine options, report output, consoles."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from gate.core.adjudicate import GateResult
from gate.core.atomic import atomic_write
from gate.errors import InputError

FORMATS = ("rich", "json", "markdown", "junit", "html")


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


def check_format(fmt: str | None) -> str:
    fmt = fmt or "rich"
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return fmt


def emit_report(result: GateResult, fmt: str, output: Path | None, *, force: bool = False) -> None:
    """Render `result`; write it to `output` atomically or print it to stdout.

    When the report goes to a file, the summary line goes to stderr so a person watching
    a CI log still sees the verdict. A report on stdout is the only output on success: it
    carries the summary itself, and `gate compare ... --format json 2>&1 | jq` must parse.
    """
    from gate.reports import render

    fmt = check_format(fmt)
    if fmt == "rich" and output is None and sys.stdout.isatty():
        from gate.reports.terminal import print_report

        print_report(result, Console(highlight=False, soft_wrap=False))
    else:  # a file or a pipe: fixed width, no colour codes (render_text for "rich")
        text = render(result, fmt)
        if output is not None:
            atomic_write(output, text.encode("utf-8"), overwrite=force)
            print(f"{result.summary}\nreport written to {output}", file=sys.stderr)
        else:
            sys.stdout.write(text)
            if not text.endswith("\n"):
                sys.stdout.write("\n")
            sys.stdout.flush()
    _append_step_summary(result)


def _append_step_summary(result: GateResult) -> None:
    """In a GitHub Actions job (`GITHUB_STEP_SUMMARY` set), append the Markdown report to
    the job summary, whatever the format asked for. A summary that cannot be written is a
    warning: it must not change the gate's verdict or exit code."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return
    from gate.reports import render

    try:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(render(result, "markdown"))
            fh.write("\n")
    except OSError as exc:
        print(f"gate: warning: cannot append to GITHUB_STEP_SUMMARY {target}: {exc.strerror or exc}", file=sys.stderr)
