"""`gate diagnose` captures a plugin engine through the capability protocol alone: a class
with `capture_activations` (tests/helpers/activations_plugin.py, written against
`gate.engine` only, no HFEngine) is located like a built-in engine, on the prefill path."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from helpers.gate_cli import invoke

pytestmark = pytest.mark.slow

PLUGIN = "helpers.activations_plugin:ActivationsPluginEngine"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    from helpers.tiny_pin import MODEL, build_tiny_pin, one_thread

    with one_thread():
        weights, pins = build_tiny_pin(tmp_path_factory.mktemp("plugin-diagnose"))
        yield ["--model", MODEL, "--model-path", str(weights), "--pins-dir", str(pins), "--engine", PLUGIN]


def test_a_plugins_planted_bug_is_located_at_its_layer_and_part(tiny: list[str]) -> None:
    r = invoke(["diagnose", *tiny, "--engine-opt", "layer=1", "--prompt", "p03", "--position", "5", "--format", "json"])
    assert r.exit_code == 1, r.stderr
    d = orjson.loads(r.stdout)
    assert (d["first_divergent_layer"], d["first_divergent_part"], d["path"]) == (1, "attention", "prefill")
    assert "diagnosing prompt p03 position 5 (prefill path)" in r.stderr
    assert any("capture_activations" in note for note in d["notes"])


def test_the_honest_plugin_is_located_nowhere(tiny: list[str]) -> None:
    r = invoke(["diagnose", *tiny, "--prompt", "p03", "--position", "5", "--format", "json"])
    assert r.exit_code == 0, r.stderr
    assert orjson.loads(r.stdout)["first_divergent_layer"] is None
