"""`gate diagnose --engine mlx` on the default model (SmolLM2-135M, 30 layers, MLX bf16 on
CPU) at a position where the MLX engine leaves the oracle (an exact tie of the pin's): the
honest engine is located nowhere, and a planted bug (layer 9's MLP output times 1.5,
tests/helpers/mlx_planted.py) at layer 9, mlp, from the engine's own activations."""

from __future__ import annotations

import orjson
import pytest
from helpers.gate_cli import invoke

pytest.importorskip("mlx_lm")

pytestmark = pytest.mark.slow

# The MLX bf16 engine's first divergence from the committed pin on the first prompt that diverges
# (forced decode): the oracle's exact tie of ids 198 and 2017; MLX takes 2017.
PROMPT, POSITION = "code-numpy", 1
AT = ["--prompt", PROMPT, "--position", str(POSITION), "--format", "json"]


def test_the_honest_mlx_engine_is_located_nowhere_on_the_default_model() -> None:
    r = invoke(["diagnose", "--engine", "mlx", *AT])
    assert r.exit_code == 0, r.stderr
    d = orjson.loads(r.stdout)
    assert d["first_divergent_layer"] is None and d["path"] == "decode", d["summary"]
    assert d["missing_modules"] == []


def test_a_planted_mlp_bug_in_layer_9_of_the_mlx_engine_is_located_there() -> None:
    r = invoke(["diagnose", "--engine", "helpers.mlx_planted:PlantedMLXEngine", "--engine-opt", "scale_mlp=9:1.5", *AT])
    assert r.exit_code == 1, r.stderr
    d = orjson.loads(r.stdout)
    assert (d["first_divergent_layer"], d["first_divergent_part"], d["path"]) == (9, "mlp", "decode"), d["summary"]
