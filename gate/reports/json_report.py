"""JSON report v1 (spec): orjson, keys fixed by the spec first."""

from __future__ import annotations

from typing import Any

import orjson

from gate.core.verdict.result import GateResult
from gate.reports.profile import divergence_profile
from gate.reports.reason import reason


def render_json(result: GateResult) -> str:
    # Beyond the spec's fixed keys (the spec allows added keys): "reason", the verdict and
    # why in one sentence, placed right after the exit code so it reads first;
    # "divergence_profile".
    data = result.to_dict()
    head: dict[str, Any] = {k: data.pop(k) for k in ("gate_report", "verdict", "exit_code") if k in data}
    out: dict[str, Any] = {
        **head,
        "reason": reason(result),
        **data,
        "divergence_profile": divergence_profile(result).to_dict(),
    }
    return orjson.dumps(out, option=orjson.OPT_INDENT_2).decode("utf-8") + "\n"
