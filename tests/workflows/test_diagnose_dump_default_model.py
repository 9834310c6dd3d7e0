"""On the default model (slow: loads it four times, under the heavy lock): another engine
(scripts/other_engine_dump.py, plain transformers, no gate) dumps its activations over the
context gate emits; a planted bug in its layer 9 MLP is located at layer 9, mlp, from that
dump alone, and its honest dump is located nowhere."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import orjson
import pytest
from helpers.gate_cli import invoke

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_another_engines_dump_locates_its_bug_and_its_honest_dump_nowhere(tmp_path: Path) -> None:
    from helpers.tiny_pin import one_thread

    from gate.models.default import DEFAULT_MODEL, resolve_model_path

    spec = importlib.util.spec_from_file_location("other_engine_dump", ROOT / "scripts" / "other_engine_dump.py")
    assert spec is not None and spec.loader is not None
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    weights = Path(resolve_model_path(DEFAULT_MODEL))
    context = tmp_path / "context.json"
    with one_thread():
        r = invoke(["diagnose", "--prompt", "chat-haiku", "--position", "12", "--emit-context", str(context)])
        assert r.exit_code == 0, r.stderr
        assert len(json.loads(context.read_text())["modules"]) > 150
        other.dump(context, weights, tmp_path / "bug.safetensors", scale_mlp="9:1.5")
        other.dump(context, weights, tmp_path / "honest.safetensors")
        r = invoke(["diagnose", "--candidate-activations", str(tmp_path / "bug.safetensors"), "--format", "json"])
        assert r.exit_code == 1, r.stderr
        d = orjson.loads(r.stdout)
        assert (d["first_divergent_layer"], d["first_divergent_part"], d["path"]) == (9, "mlp", "prefill")
        assert d["missing_modules"] == []
        r = invoke(["diagnose", "--candidate-activations", str(tmp_path / "honest.safetensors"), "--format", "json"])
        assert r.exit_code == 0, r.stderr
        assert orjson.loads(r.stdout)["first_divergent_layer"] is None
