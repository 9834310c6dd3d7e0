"""The documentation matches the code: docs/reference/trace-format.md names every field gate writes
in a trace, and the engine tables name every built-in engine."""

from __future__ import annotations

import json
from pathlib import Path

from gate.core.traces.moe import ROUTING_FIELDS
from gate.core.traces.trace import FORCED_TOP_KEY
from gate.core.verdict.doctrine import DOCTRINE_FIELDS, Evidence
from gate.engines.registry import BUILTIN

ROOT = Path(__file__).resolve().parents[2]
TRACE_FORMAT = (ROOT / "docs" / "reference" / "trace-format.md").read_text()


def first_two(path: Path) -> tuple[dict[str, object], dict[str, object]]:
    with open(path, "rb") as fh:
        return json.loads(fh.readline()), json.loads(fh.readline())


def named(key: str) -> bool:
    return f"`{key}`" in TRACE_FORMAT


def test_trace_format_names_every_field_of_the_committed_pin_and_golden() -> None:
    pin_head, pin_rec = first_two(ROOT / "oracle_pins" / "HuggingFaceTB" / "SmolLM2-135M-Instruct" / "pin.jsonl")
    gold_head, gold_rec = first_two(ROOT / "goldens" / "HuggingFaceTB" / "SmolLM2-135M-Instruct" / "hf.jsonl")
    keys = {*pin_head, *pin_rec, *gold_head, *gold_rec}
    keys |= set(pin_head["hardware"]) | set(pin_head["sampling"]) | set(gold_head["pin"])  # type: ignore[arg-type]
    missing = sorted(k for k in keys if not named(k))
    assert missing == []


def test_trace_format_names_every_field_the_engines_and_workflows_add() -> None:
    added = {
        FORCED_TOP_KEY,
        *ROUTING_FIELDS,
        "forced_mode",
        "token_logits",
        "shard",
        "merged_from",
        "pin_suite_sha256",
        "moe",
        "forced_isa",
        "device_name",
        "compute_capability",
        *DOCTRINE_FIELDS,
        *Evidence(0.0, 0.0, 0.0).to_dict(),
    }
    assert sorted(k for k in added if not named(k)) == []


def test_the_engine_tables_name_every_built_in_engine() -> None:
    engines = (ROOT / "docs" / "reference" / "engines.md").read_text()
    table = [line for line in engines.splitlines() if line.startswith("| `")]
    listed = {line.split("`")[1] for line in table}
    assert set(BUILTIN) <= listed, set(BUILTIN) - listed
