"""`gate diagnose` on an engine gate does not drive, from its own activations, on a tiny pinned
Llama: `--emit-context` names the context and the modules; scripts/other_engine_dump.py plays
the other engine (plain transformers, forward hooks, safetensors; no gate); its dump with a
planted bug is located at its layer and part, its honest dump nowhere; a plugin with
`capture_activations` takes the same path; a bad dump is exit 2 with one line naming it."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import pytest
from helpers.gate_cli import invoke

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PROMPT, POSITION = "p03", 5


def other_engine() -> ModuleType:
    spec = importlib.util.spec_from_file_location("other_engine_dump", ROOT / "scripts" / "other_engine_dump.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[str], Path, Path]]:
    """(the common arguments, the weights, the emitted context file)."""
    from helpers.tiny_pin import MODEL, build_tiny_pin, one_thread

    root = tmp_path_factory.mktemp("diagnose-dump")
    with one_thread():
        weights, pins = build_tiny_pin(root)
        base = ["--model", MODEL, "--pins-dir", str(pins), "--reference-model", str(weights)]
        context = root / "context.json"
        r = invoke(["diagnose", *base, "--prompt", PROMPT, "--position", str(POSITION), "--emit-context", str(context)])
        assert r.exit_code == 0, r.stderr
        yield base, weights, context


def dump(tiny: tuple[list[str], Path, Path], out: Path, **options: Any) -> Path:
    _, weights, context = tiny
    other_engine().dump(context, weights, out, **options)
    return out


def test_the_emitted_context_names_the_ids_and_every_module(tiny: tuple[list[str], Path, Path]) -> None:
    from gate.core.diagnosis.dump import context_sha256

    base, _, context = tiny
    c = json.loads(context.read_text())
    assert (c["prompt_id"], c["position"], c["path"], c["model"]) == (PROMPT, POSITION, "decode", "tiny/llama-doctrine")
    ids = c["context_token_ids"]
    assert ids[: len(c["prompt_token_ids"])] == c["prompt_token_ids"]
    assert len(ids) == len(c["prompt_token_ids"]) + POSITION == c["context_length"]
    assert c["context_sha256"] == context_sha256(ids) == c["metadata"]["context_sha256"]
    names = [m["name"] for m in c["modules"]]
    for name in ("model.embed_tokens", "model.layers.1.input_layernorm", "model.layers.1.self_attn"):
        assert name in names
    assert {"model.layers.1.mlp", "model.layers.1", "model.norm", "lm_head"} <= set(names)
    shapes = {m["name"]: m["shape"] for m in c["modules"]}
    assert shapes["model.layers.1"] == [len(ids), 128] and shapes["lm_head"] == [len(ids), 259]
    assert c["pin"]["suite_sha256"] and c["pin"]["pin_sha256"]
    again = ["diagnose", *base, "--prompt", PROMPT, "--position", str(POSITION), "--emit-context", str(context)]
    assert invoke(again).exit_code == 2  # never overwritten without --force


@pytest.mark.parametrize(("store", "path"), [("bf16", "prefill"), ("f32", "decode")])
def test_a_planted_bug_in_another_engine_is_located_from_its_own_dump(
    tiny: tuple[list[str], Path, Path], tmp_path: Path, store: str, path: str
) -> None:
    base = tiny[0]
    bug = dump(tiny, tmp_path / "bug.safetensors", store=store, path=path, scale_mlp="1:2")
    r = invoke(["diagnose", *base, "--candidate-activations", str(bug), "--format", "json"])
    assert r.exit_code == 1, r.stderr
    d = orjson.loads(r.stdout)
    assert (d["first_divergent_layer"], d["first_divergent_part"], d["path"]) == (1, "mlp", path)
    assert (d["prompt_id"], d["position"], d["missing_modules"], d["other_path"]) == (PROMPT, POSITION, [], None)
    assert d["engines"]["candidate"]["class"] == "dump"
    honest = dump(tiny, tmp_path / "honest.safetensors", store=store, path=path)
    r = invoke(["diagnose", *base, "--candidate-activations", str(honest)])
    assert r.exit_code == 0, r.stderr
    assert "nothing leaves the honest band" in r.stdout


def test_a_dump_without_some_modules_says_which_it_could_not_judge(
    tiny: tuple[list[str], Path, Path], tmp_path: Path
) -> None:
    from gate.core.diagnosis.dump import read_safetensors, write_safetensors

    base = tiny[0]
    arrays, meta = read_safetensors(dump(tiny, tmp_path / "full.safetensors", scale_mlp="1:2").read_bytes(), "x")
    del arrays["model.layers.1.mlp"], arrays["model.layers.0.self_attn"]
    part = tmp_path / "part.safetensors"
    part.write_bytes(write_safetensors(arrays, meta))
    r = invoke(["diagnose", *base, "--candidate-activations", str(part), "--format", "json"])
    assert r.exit_code == 1, r.stderr
    d = orjson.loads(r.stdout)
    assert d["missing_modules"] == ["model.layers.0.self_attn", "model.layers.1.mlp"]
    assert (d["first_divergent_layer"], d["first_divergent_part"]) == (1, "residual")  # where it shows next
    r = invoke(["diagnose", *base, "--candidate-activations", str(part)])
    assert "not in the candidate's capture: model.layers.0.self_attn, model.layers.1.mlp" in r.stdout


def test_a_plugin_with_capture_activations_takes_the_same_path(tiny: tuple[list[str], Path, Path]) -> None:
    base = tiny[0][:4]  # the model and the pins; the reference: the engine's own weights
    engine = ["--engine", "helpers.planted_engines:OwnActivationsMLPBug", "--model-path", str(tiny[1])]
    at = ["--prompt", PROMPT, "--position", str(POSITION), "--format", "json"]
    r = invoke(["diagnose", *base, *engine, "--engine-opt", "layer=1", *at])
    assert r.exit_code == 1, r.stderr
    d = orjson.loads(r.stdout)
    # Located at its layer and part. (An engine built on HFEngine also captures through both
    # paths, CapturesPaths, which comes first; the other path then shows the same.)
    assert (d["first_divergent_layer"], d["first_divergent_part"]) == (1, "mlp")
    r = invoke(["diagnose", *base, *engine, "--engine-opt", "factor=1", *at])
    assert r.exit_code == 0, r.stderr


def _write(path: Path, tensors: dict[str, np.ndarray], meta: dict[str, str], dtype: str = "F32") -> Path:
    from gate.core.diagnosis.dump import write_safetensors

    path.write_bytes(write_safetensors(tensors, meta, dtype=dtype))
    return path


def test_bad_dumps_are_exit_2_with_one_line_naming_the_tensor_or_field(
    tiny: tuple[list[str], Path, Path], tmp_path: Path
) -> None:
    from gate.core.diagnosis.dump import read_safetensors

    base = tiny[0]
    arrays, meta = read_safetensors(dump(tiny, tmp_path / "ok.safetensors", store="f32").read_bytes(), "x")
    n = arrays["model.layers.1.mlp"].shape[0]
    short = {**arrays, "model.layers.1.mlp": arrays["model.layers.1.mlp"][:-1]}
    wide = {**arrays, "model.layers.0": arrays["model.layers.0"][:, :-1]}
    numpy_api = pytest.importorskip("safetensors.numpy")
    half = tmp_path / "half.safetensors"
    numpy_api.save_file({k: v.astype(np.float16) for k, v in arrays.items()}, str(half), metadata=meta)
    other = {**meta, "context_sha256": "0" * 64}
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x80\x04\x95 a pickle, not a safetensors file")
    cases = [
        (_write(tmp_path / "short.safetensors", short, meta), f"'model.layers.1.mlp' has shape [{n - 1}, 128]"),
        (
            _write(tmp_path / "wide.safetensors", wide, meta),
            f"'model.layers.0' has shape [{n}, 127]: expected [{n}, 128]",
        ),
        (half, "is F16: expected F32 or BF16"),
        (_write(tmp_path / "other.safetensors", arrays, other), "context_sha256"),
        (
            _write(tmp_path / "renamed.safetensors", {"layers.1.mlp": arrays["model.layers.1.mlp"]}, meta),
            "layers.1.mlp",
        ),
        (garbage, "not a safetensors file"),
        (tmp_path / "absent.safetensors", "no such file"),
    ]
    for path, message in cases:
        r = invoke(["diagnose", *base, "--candidate-activations", str(path)])
        assert r.exit_code == 2, (path, r.stderr)
        errors = [line for line in r.stderr.splitlines() if line.startswith("gate: ")]
        assert len(errors) == 1 and message in errors[0], r.stderr
        assert "Traceback" not in r.stderr
    ok = tmp_path / "ok.safetensors"
    for extra, message in (
        (["--engine", "hf"], "--engine goes with a candidate engine"),
        (["--emit-context", str(tmp_path / "c.json")], "one at a time"),
        (["--output", str(ok), "--force"], "ok.safetensors"),
    ):
        r = invoke(["diagnose", *base, "--candidate-activations", str(ok), *extra])
        assert r.exit_code == 2 and message in r.stderr, r.stderr


def test_emit_context_never_writes_over_a_file_of_the_reference_model(
    tiny: tuple[list[str], Path, Path], tmp_path: Path
) -> None:
    """--force replaces an earlier output, never an input: the reference model's own files
    (its config, its weights, through a link too) are inputs of the diagnosis."""
    base, weights, _ = tiny
    link = tmp_path / "link.json"
    link.symlink_to(weights / "config.json")
    for target in (weights / "config.json", weights / "model.safetensors", link):
        before = (weights / target.name).read_bytes() if target != link else (weights / "config.json").read_bytes()
        args = ["diagnose", *base, "--prompt", PROMPT, "--position", str(POSITION), "--emit-context", str(target)]
        r = invoke([*args, "--force"])
        assert r.exit_code == 2, r.stderr
        assert "an input is never its own output" in r.stderr and "Traceback" not in r.stderr
        assert (weights / ("config.json" if target == link else target.name)).read_bytes() == before
