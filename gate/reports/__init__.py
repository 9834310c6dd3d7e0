"""Renderers: pure functions `result -> str`, one registry keyed by result type and format.

Every command's report goes through `render` (text for a file or a pipe) or `print_rich`
(colour at the terminal's width); modules load lazily, so `gate --help` imports none.
A new format is one line in `RENDERERS`; a new result type, one line per format it has.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Protocol

from gate.errors import InputError


class Reportable(Protocol):
    """What every command's result has for the output sink: its renderers, found by its type's
    name in `RENDERERS` and `TERMINAL`, and its one-line summary (said on stderr when the
    report goes to a file). Its exit code is the command's business."""

    @property
    def summary(self) -> str: ...


# (result type, format) -> "module:function" giving the report as text.
RENDERERS: dict[tuple[str, str], str] = {
    ("GateResult", "rich"): "gate.reports.terminal:render_text",
    ("GateResult", "json"): "gate.reports.json_report:render_json",
    ("GateResult", "markdown"): "gate.reports.markdown:render_markdown",
    ("GateResult", "junit"): "gate.reports.junit:render_junit",
    ("GateResult", "html"): "gate.reports.html:render_html",
    ("GoldensResult", "rich"): "gate.reports.goldens:render_goldens_text",
    ("GoldensResult", "json"): "gate.reports.goldens:render_goldens_json",
    ("GoldensResult", "markdown"): "gate.reports.goldens:render_goldens_markdown",
    ("Calibration", "rich"): "gate.reports.calibrate:render_calibration_text",
    ("Calibration", "json"): "gate.reports.calibrate:render_calibration_json",
    ("SelfTestResult", "rich"): "gate.reports.selftest:render_selftest_text",
    ("SelfTestResult", "json"): "gate.reports.selftest:render_selftest_json",
    ("Diagnosis", "rich"): "gate.reports.diagnose:render_diagnosis_text",
    ("Diagnosis", "json"): "gate.reports.diagnose:render_diagnosis_json",
    ("Diagnosis", "html"): "gate.reports.diagnose:render_diagnosis_html",
    ("InvarianceResult", "rich"): "gate.reports.invariance:render_invariance_text",
    ("InvarianceResult", "json"): "gate.reports.invariance:render_invariance_json",
    ("InvarianceResult", "markdown"): "gate.reports.invariance:render_invariance_markdown",
    ("InvarianceResult", "html"): "gate.reports.invariance:render_invariance_html",
    ("ReportDiff", "rich"): "gate.reports.diff:render_diff_text",
    ("ReportDiff", "json"): "gate.reports.diff:render_diff_json",
    ("ReportDiff", "markdown"): "gate.reports.diff:render_diff_markdown",
}

# Result type -> "module:function(result, console)" drawing the rich report on a terminal.
TERMINAL: dict[str, str] = {
    "GateResult": "gate.reports.terminal:print_report",
    "GoldensResult": "gate.reports.goldens:print_goldens",
    "Calibration": "gate.reports.calibrate:print_calibration",
    "SelfTestResult": "gate.reports.selftest:print_selftest",
    "Diagnosis": "gate.reports.diagnose:print_diagnosis",
    "InvarianceResult": "gate.reports.invariance:print_invariance",
    "ReportDiff": "gate.reports.diff:print_diff",
}


def formats(kind: str) -> tuple[str, ...]:
    """The formats a result type renders to, in the registry's order."""
    return tuple(f for k, f in RENDERERS if k == kind)


def check_format(kind: str, fmt: str | None) -> str:
    """`fmt` (default rich) if `kind` renders to it, else an input error listing the formats."""
    fmt = "rich" if fmt is None else fmt  # "" is a bad value, not the default
    known = formats(kind)
    if fmt not in known:
        raise InputError(f"--format {fmt!r}: expected one of {', '.join(known)}")
    return fmt


def _load(target: str) -> Any:
    module, _, func = target.partition(":")
    return getattr(importlib.import_module(module), func)


def _with_details(func: Any, details: bool) -> dict[str, bool]:
    """`details=True` for a renderer that has a details section (the others have none)."""
    return {"details": True} if details and "details" in inspect.signature(func).parameters else {}


def _with_width(func: Any, width: int | None) -> dict[str, int]:
    """`width` for a renderer that lays text out to a width (the text reports)."""
    return {"width": width} if width is not None and "width" in inspect.signature(func).parameters else {}


def render(result: Reportable, fmt: str, *, details: bool = False, width: int | None = None) -> str:
    """`result` as text in `fmt` (`details`: with the details section, where it has one;
    `width`: the columns of a text report, else its default). No line ends in spaces, in
    any format: padding that a table or panel leaves at a line's end is taken off."""
    kind = type(result).__name__
    func = _load(RENDERERS[kind, check_format(kind, fmt)])
    text = str(func(result, **_with_details(func, details), **_with_width(func, width)))
    return trim_line_ends(text)


def trim_line_ends(text: str) -> str:
    """`text` with the spaces and tabs at the end of each line removed."""
    return "\n".join(line.rstrip(" \t") for line in text.split("\n"))


def has_format(result: Reportable, fmt: str) -> bool:
    return (type(result).__name__, fmt) in RENDERERS


def print_rich(result: Reportable, console: Any, *, details: bool = False) -> None:
    """Draw `result`'s rich report on `console` (a terminal: colour, its width)."""
    func = _load(TERMINAL[type(result).__name__])
    func(result, console, **_with_details(func, details))
