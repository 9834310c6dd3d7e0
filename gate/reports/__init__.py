"""Renderers: pure functions `GateResult -> str`. Formats load lazily."""

from __future__ import annotations

import importlib

from gate.core.adjudicate import GateResult

_RENDERERS = {
    "json": "gate.reports.json_report:render_json",
    "markdown": "gate.reports.markdown:render_markdown",
    "junit": "gate.reports.junit:render_junit",
    "rich": "gate.reports.terminal:render_text",
    "html": "gate.reports.html:render_html",
}


def render(result: GateResult, fmt: str) -> str:
    module, _, func = _RENDERERS[fmt].partition(":")
    fn = getattr(importlib.import_module(module), func)
    return str(fn(result))
