"""JSON report v1 (spec): orjson, keys fixed by the spec first."""

from __future__ import annotations

import orjson

from gate.core.adjudicate import GateResult


def render_json(result: GateResult) -> str:
    return orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2).decode("utf-8") + "\n"
