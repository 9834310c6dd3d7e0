"""JSON report v1 (spec): orjson, keys fixed by the spec first."""

from __future__ import annotations

import orjson

from gate.core.verdict.result import GateResult
from gate.reports.profile import divergence_profile


def render_json(result: GateResult) -> str:
    # "divergence_profile" is beyond the spec's fixed keys (the spec allows added keys).
    out = {**result.to_dict(), "divergence_profile": divergence_profile(result).to_dict()}
    return orjson.dumps(out, option=orjson.OPT_INDENT_2).decode("utf-8") + "\n"
