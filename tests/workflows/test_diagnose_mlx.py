"""`gate diagnose --engine mlx` on a tiny pinned Llama (transformers' bf16 folder, which MLX
loads as it is): the honest MLX engine is located nowhere on either path; a planted MLP bug
(tests/helpers/mlx_planted.py) at its layer and part on both; the engine's own
`capture_activations` written as a dump is located the same way through
`--candidate-activations` (one check for a plugin and a dump); a folder MLX cannot load is
exit 3, one line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from helpers.gate_cli import invoke

pytest.importorskip("mlx_lm")

pytestmark = pytest.mark.slow

PLANTED = "helpers.mlx_planted:PlantedMLXEngine"
PROMPT, POSITION = "p03", 5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[str], Path]]:
    """(--model and --pins-dir, the weights)."""
    from helpers.tiny_pin import MODEL, build_tiny_pin, one_thread

    with one_thread():
        weights, pins = build_tiny_pin(tmp_path_factory.mktemp("mlx-diagnose"))
        yield ["--model", MODEL, "--pins-dir", str(pins)], weights


def diagnose(tiny: tuple[list[str], Path], *args: str) -> tuple[int, dict, str]:
    base, weights = tiny
    at = ["--prompt", PROMPT, "--position", str(POSITION), "--format", "json"]
    r = invoke(["diagnose", *base, "--model-path", str(weights), *args, *at])
    return r.exit_code, orjson.loads(r.stdout) if r.stdout.strip() else {}, r.stderr


def test_the_honest_mlx_engine_is_located_nowhere_on_either_path(tiny: tuple[list[str], Path]) -> None:
    code, d, err = diagnose(tiny, "--engine", "mlx")
    assert code == 0, err
    assert d["first_divergent_layer"] is None and d["path"] == "decode"
    assert d["engines"]["candidate"]["class"] == "MLXEngine"
    assert d["missing_modules"] == []  # every module the reference has, the MLX capture has


def test_a_planted_mlp_bug_in_the_mlx_engine_is_located_at_its_layer_and_part(tiny: tuple[list[str], Path]) -> None:
    code, d, err = diagnose(tiny, "--engine", PLANTED, "--engine-opt", "scale_mlp=1:1.5")
    assert code == 1, err
    assert (d["first_divergent_layer"], d["first_divergent_part"], d["path"]) == (1, "mlp", "decode")
    assert d["summary"].startswith("enters at layer 1, mlp, decode path"), d["summary"]
    assert "the prefill path shows it too (layer 1, mlp)" in d["summary"]


@pytest.mark.parametrize(("plant", "code"), [("1:1.5", 1), (None, 0)])
def test_the_mlx_engines_named_activations_as_a_dump_take_the_same_path(
    tiny: tuple[list[str], Path], tmp_path: Path, plant: str | None, code: int
) -> None:
    from helpers.mlx_planted import PlantedMLXEngine

    from gate.core.diagnosis.dump import context_sha256, write_safetensors

    base, weights = tiny
    context = tmp_path / "ctx.json"
    r = invoke(["diagnose", *base, "--reference-model", str(weights), "--prompt", PROMPT, "--position", str(POSITION),
                "--path", "prefill", "--emit-context", str(context)])  # fmt: skip
    assert r.exit_code == 0, r.stderr
    ctx = orjson.loads(context.read_bytes())
    engine = PlantedMLXEngine(str(weights), **({"scale_mlp": plant} if plant else {}))
    try:
        arrays = engine.capture_activations(ctx["context_token_ids"], [m["name"] for m in ctx["modules"]])
    finally:
        engine.close()
    assert sorted(arrays) == sorted(m["name"] for m in ctx["modules"])
    meta = {"context_sha256": context_sha256(ctx["context_token_ids"]), "prompt_id": PROMPT,
            "position": str(POSITION), "path": "prefill", "engine": "mlx"}  # fmt: skip
    dump = tmp_path / "mlx.safetensors"
    dump.write_bytes(write_safetensors(arrays, meta, dtype="BF16"))
    r = invoke(["diagnose", *base, "--reference-model", str(weights), "--candidate-activations", str(dump),
                "--format", "json"])  # fmt: skip
    assert r.exit_code == code, r.stderr
    d = orjson.loads(r.stdout)
    where = (d["first_divergent_layer"], d["first_divergent_part"], d["path"])
    assert where == ((1, "mlp", "prefill") if plant else (None, None, "prefill")), d["summary"]


def test_a_folder_mlx_cannot_load_is_exit_3_in_one_line(tiny: tuple[list[str], Path], tmp_path: Path) -> None:
    base, weights = tiny
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "config.json").write_bytes((weights / "config.json").read_bytes())
    (folder / "model.safetensors").write_bytes(b"not safetensors")
    r = invoke(["diagnose", *base, "--engine", "mlx", "--engine-opt", f"model_path={folder}",
                "--reference-model", str(weights), "--prompt", PROMPT, "--position", str(POSITION)])  # fmt: skip
    assert r.exit_code == 3, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("diagnosing")]
    assert len(lines) == 1 and "MLX cannot load" in lines[0], r.stderr
    assert "Traceback" not in r.output
