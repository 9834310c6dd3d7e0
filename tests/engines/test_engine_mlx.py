"""The MLX engine: mlx-lm's own greedy loop and tie rule, forced decode through the KV cache,
MLX-quantised builds cached with a manifest, faults as one line, and, marked slow, the embedded
default model against mlx-lm's native decode loop and its pin."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlx_lm")

import mlx.core as mx
import numpy as np
from helpers.gate_cli import invoke
from helpers.tiny_mlx import build_tiny_mlx_llama
from helpers.tiny_models import TIE_HIGH, TIE_LOW
from mlx_lm.generate import generate_step

from gate.core.engine import PromptInput, schedule_knobs
from gate.engines.mlx.engine import MLXEngine
from gate.errors import EngineError, InputError
from gate.models.mlx_build import MLX_MANIFEST, check_mlx_folder, mlx_quantised

TOP_K = 5
TEXTS = ("import numpy as np", "The capital of France is", "1, 2, 3, 4,", "def fibonacci(n):")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_mlx_llama(tmp_path_factory.mktemp("tiny-mlx") / "m")


@pytest.fixture(scope="module")
def tiny(tiny_folder: Path) -> Iterator[MLXEngine]:
    engine = MLXEngine(str(tiny_folder))
    yield engine
    engine.close()


def _prompts(engine: Any, n: int, texts: tuple[str, ...] = TEXTS) -> list[PromptInput]:
    return [PromptInput(f"p{i}", engine.encode(t), n, prompt=t) for i, t in enumerate(texts)]


def _native(model: Any, prompt_ids: tuple[int, ...], n: int) -> list[int]:
    """mlx-lm's own greedy loop: `generate_step` with its default (greedy) sampler."""
    out: list[int] = []
    for token, _ in generate_step(mx.array(list(prompt_ids)), model, max_tokens=n):
        out.append(int(token))
    return out


# --------------------------------------------------------------------------- tiny models (fast)


def test_greedy_is_mlx_lms_own_decode_loop_token_for_token(tiny: MLXEngine) -> None:
    for p in _prompts(tiny, 24):
        rec = tiny.generate([p], TOP_K)[0]
        assert list(rec.token_ids) == _native(tiny.model, p.prompt_token_ids, len(rec.token_ids)), p.id
        assert rec.top_logprobs is not None and len(rec.top_logprobs) == len(rec.token_ids)
        assert len(rec.token_logits or ()) == len(rec.token_ids)
        for token, top in zip(rec.token_ids, rec.top_logprobs, strict=True):
            assert token in [t for t, _ in top]
            assert top == sorted(top, key=lambda pair: (-pair[1], pair[0]))


def test_forced_decode_on_its_own_tokens_reproduces_generate_bit_for_bit(tiny: MLXEngine) -> None:
    for p in _prompts(tiny, 12):
        rec = tiny.generate([p], TOP_K)[0]
        forced = tiny.force(p.prompt_token_ids, rec.token_ids, TOP_K)
        assert forced.mode == "decode"
        assert forced.token_ids == rec.token_ids and forced.top_logprobs == rec.top_logprobs


def test_forced_decode_feeds_the_oracles_tokens_not_its_own(tiny: MLXEngine) -> None:
    p = _prompts(tiny, 8)[0]
    rec = tiny.generate([p], TOP_K)[0]
    other = ((rec.token_ids[0] + 1) % 256, *rec.token_ids[1:])
    moved = tiny.force(p.prompt_token_ids, other, TOP_K)
    assert moved.top_logprobs is not None and rec.top_logprobs is not None
    assert moved.top_logprobs[0] == rec.top_logprobs[0]  # before the fed token: the same context
    assert moved.top_logprobs[1] != rec.top_logprobs[1]  # after it: the oracle's context


def test_forced_decode_through_the_cache_equals_one_full_forward(tiny_folder: Path, tiny: MLXEngine) -> None:
    """Decode steps on the KV cache against `force_mode=prefill` (one forward pass over the
    prompt and the fed tokens, a fresh cache): the same picks, the same logprobs within bf16
    rounding of the attention's different shapes."""
    whole = MLXEngine(str(tiny_folder), force_mode="prefill")
    for p in _prompts(tiny, 10):
        fed = tiny.generate([p], 0)[0].token_ids
        step = tiny.force(p.prompt_token_ids, fed, TOP_K)
        one = whole.force(p.prompt_token_ids, fed, TOP_K)
        assert one.mode == "prefill" and one.token_ids == step.token_ids
        assert one.top_logprobs is not None and step.top_logprobs is not None
        for a, b in zip(one.top_logprobs, step.top_logprobs, strict=True):
            assert [t for t, _ in a[:1]] == [t for t, _ in b[:1]]
            assert abs(a[0][1] - b[0][1]) < 0.05


def test_exact_ties_go_to_the_lowest_id_as_mlx_argmax_does(tmp_path: Path) -> None:
    """The tie model's rows TIE_LOW and TIE_HIGH are the same: every position is an exact tie
    in the logits and the logprobs; MLX's argmax keeps the first maximum."""
    engine = MLXEngine(str(build_tiny_mlx_llama(tmp_path / "tie", tie_rows=True)))
    for rec in engine.generate(_prompts(engine, 6), TOP_K):
        assert set(rec.token_ids) == {TIE_LOW}
        assert rec.top_logprobs is not None
        for top in rec.top_logprobs:
            assert [top[0][0], top[1][0]] == [TIE_LOW, TIE_HIGH] and top[0][1] == top[1][1]
        assert rec.extra["pick_not_logit_argmax"] == []


def test_mlx_argmax_keeps_the_first_maximum_in_every_dtype() -> None:
    """The direct experiment behind the engine's tie rule (docs/results/engine-mlx.md)."""
    rng = np.random.default_rng(0)
    for dtype in (mx.float32, mx.bfloat16, mx.float16):
        for n in (2, 33, 49152):
            for _ in range(20):
                row = rng.standard_normal(n).astype(np.float32)
                at = np.sort(rng.choice(n, size=min(n, 3), replace=False))
                row[at] = 10.0
                assert mx.argmax(mx.array(row).astype(dtype)[None], axis=-1).item() == at[0]


def test_a_bf16_logprob_tie_the_logits_do_not_have_goes_to_the_lower_id(tiny: MLXEngine) -> None:
    """mlx-lm picks on `logits - logsumexp` in bfloat16: logits one bf16 step apart can round to
    one logprob, and the lower id wins though its logit is the smaller. The engine follows it
    (it is the engine under test) and names the position."""
    row = np.full(259, -1.0, dtype=np.float32)
    row[3], row[5] = 1.0, 1.0078125  # one bfloat16 step apart at 1.0
    odd: list[int] = []
    raw: list[float] = []
    picked, row32 = tiny._pick(mx.array(row).astype(mx.bfloat16)[None])
    token, top = tiny._read(picked, row32, 7, 3, odd, raw)
    assert token == 3 and odd == [7] and raw == [1.0]
    assert top is not None and [t for t, _ in top[:2]] == [5, 3] and top[0][1] > top[1][1]


def test_the_prefix_cache_reuses_the_shared_prefix_and_keeps_the_tokens(tiny_folder: Path, tiny: MLXEngine) -> None:
    warm = MLXEngine(str(tiny_folder), prefix_cache="1")
    base = "import numpy as np\nimport os\n"
    prompts = _prompts(tiny, 8, (base, base + "x = 1", base + "def f():", base))
    cold = tiny.generate(prompts, TOP_K)
    reused: list[int] = []
    reuse = warm._reuse

    def counted(ids: Any) -> Any:
        cache, start = reuse(ids)
        reused.append(start)
        return cache, start

    warm._reuse = counted  # type: ignore[method-assign]
    hot = warm.generate(prompts, TOP_K)
    assert reused[0] == 0 and all(n >= len(prompts[0].prompt_token_ids) - 1 for n in reused[1:]), reused
    assert warm.prefix_reuse() == (len(reused) - 1, sum(reused)) and tiny.prefix_reuse() == (0, 0)
    for a, b in zip(cold, hot, strict=True):
        assert a.token_ids == b.token_ids, a.id
        assert a.top_logprobs is not None and b.top_logprobs is not None
        for ra, rb in zip(a.top_logprobs, b.top_logprobs, strict=True):
            da, db = {t: lp for t, lp in ra}, {t: lp for t, lp in rb}
            assert all(abs(da[t] - db[t]) < 0.05 for t in da.keys() & db.keys())


def _with_config(src: Path, dst: Path, **changes: Any) -> Path:
    import shutil

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.pop("rope_theta", None)
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_a_transformers_5_rope_base_is_read_from_rope_parameters(tiny_folder: Path, tmp_path: Path) -> None:
    """A config that states the RoPE base only in `rope_parameters` (transformers 5) runs with
    that base, as one stating `rope_theta` (transformers 4) does; with rope_from_config off,
    mlx-lm's own reading falls back to its default base 10000."""
    v5 = _with_config(tiny_folder, tmp_path / "v5", rope_parameters={"rope_theta": 100000.0, "rope_type": "default"})
    v4 = _with_config(tiny_folder, tmp_path / "v4", rope_theta=100000.0)
    base = _with_config(tiny_folder, tmp_path / "base", rope_theta=10000.0)
    runs = {}
    for name, folder, opts in (
        ("v5", v5, {}),
        ("v4", v4, {}),
        ("v5-raw", v5, {"rope_from_config": "false"}),
        ("base", base, {}),
    ):
        engine = MLXEngine(str(folder), **opts)
        runs[name] = engine.generate(_prompts(engine, 8)[:2], TOP_K)
        if name == "v5":
            assert engine.info()["config_overrides"] == {"rope_theta": 100000.0}
        if name == "v5-raw":
            assert engine.info()["config_overrides"] == {}
    tops = {name: [r.top_logprobs for r in recs] for name, recs in runs.items()}
    assert tops["v5"] == tops["v4"] and tops["v5-raw"] == tops["base"] and tops["v5"] != tops["base"]


def test_provenance_names_mlx_the_device_dtype_and_the_weights(tiny: MLXEngine) -> None:
    from gate.models.hashing import source_hashes

    info = tiny.info()
    assert info["name"] == "mlx" and info["mlx"] == mx.__version__ and info["mlx_lm"]
    assert info["device"].startswith("Device(") and info["dtype"] == "bfloat16"
    assert info["tie_break"] == "lowest_id" and info["vocab_size"] == 259
    assert info["weights_sha256"] == source_hashes(Path(info["mlx_model_dir"]))["weights_sha256"]


def test_schedule_knobs_are_gates_names() -> None:
    from gate.core.engine import SCHEDULE_KNOBS

    knobs = schedule_knobs(MLXEngine)
    assert knobs["chunked_prefill"] == "prefill_step_size" and knobs["force_mode"] == "force_mode"
    # The prefix-cache cell's knob, where gate's vocabulary has it ("1" on, "0" off).
    assert knobs.get("prefix_cache") == ("prefix_cache" if "prefix_cache" in SCHEDULE_KNOBS else None)


def test_chunked_prefill_is_mlx_lms_prefill_step(tiny_folder: Path, tiny: MLXEngine) -> None:
    chunked = MLXEngine(str(tiny_folder), prefill_step_size="4")
    for a, b in zip(tiny.generate(_prompts(tiny, 6), TOP_K), chunked.generate(_prompts(tiny, 6), TOP_K), strict=True):
        assert a.token_ids == b.token_ids


# --------------------------------------------------------------------------- quantised builds (fast)


def test_a_quantised_build_is_cached_with_a_manifest_and_rebuilt_when_corrupt(
    tiny_folder: Path, tmp_path: Path
) -> None:
    messages: list[str] = []
    folder = mlx_quantised(tiny_folder, 4, 64, cache_dir=tmp_path, log=messages.append)
    assert len(messages) == 1 and "building the MLX 4-bit build" in messages[0]
    manifest = json.loads((folder / MLX_MANIFEST).read_text())
    assert manifest["quantisation"] == {"bits": 4, "group_size": 64, "mode": "affine", "dtype": None}
    assert manifest["source"]["weights_sha256"] and manifest["builder"]["mlx-lm"]
    assert json.loads((folder / "config.json").read_text())["quantization"]["bits"] == 4
    assert mlx_quantised(tiny_folder, 4, 64, cache_dir=tmp_path, log=messages.append) == folder
    assert len(messages) == 1  # reused, not rebuilt
    config = folder / "config.json"
    config.write_text(config.read_text() + " ")
    mlx_quantised(tiny_folder, 4, 64, cache_dir=tmp_path, log=messages.append)
    assert len(messages) == 2 and "config.json does not match its sha256" in messages[1]
    assert check_mlx_folder(folder) is None


def test_the_quantised_engine_runs_mlx_quantisation_and_keeps_the_source_hashes(
    tiny_folder: Path, tiny: MLXEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATE_CACHE_DIR", str(tmp_path))
    q4 = MLXEngine(str(tiny_folder), quantize="4")
    info = q4.info()
    assert info["quantization"]["bits"] == 4 and info["quantization"]["group_size"] == 64
    assert info["weights_sha256"] == tiny.info()["weights_sha256"] and info["mlx_model_sha256"]
    assert info["mlx_model_dir"].startswith(str(tmp_path))
    p = _prompts(q4, 10)[0]
    rec = q4.generate([p], TOP_K)[0]
    assert list(rec.token_ids) == _native(q4.model, p.prompt_token_ids, len(rec.token_ids))
    assert q4.force(p.prompt_token_ids, rec.token_ids, TOP_K).token_ids == rec.token_ids


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        ({"quantize": "7"}, "quantize=7: expected one of 2, 3, 4, 5, 6, 8"),
        ({"quantize": "4", "q_group_size": "48"}, "q_group_size=48: expected one of 32, 64, 128"),
        ({"quantize": "4", "q_bits": "8"}, "disagree"),
        ({"dtype": "int8"}, "dtype=int8: expected one of bfloat16, float16, float32"),
        ({"force_mode": "sideways"}, "force_mode=sideways: expected decode or prefill"),
        ({"prefill_step_size": "0"}, "prefill_step_size=0: expected a positive integer"),
        ({"device": "tpu"}, "device=tpu: expected cpu or gpu"),
        ({"colour": "red"}, "unknown option for engine 'mlx'"),
    ],
)
def test_bad_options_are_input_errors(tiny_folder: Path, opts: dict[str, str], message: str) -> None:
    with pytest.raises(InputError, match=message):
        MLXEngine(str(tiny_folder), **opts)


def test_a_float32_cast_is_the_dtype_the_engine_reports(tiny_folder: Path) -> None:
    engine = MLXEngine(str(tiny_folder), dtype="fp32")
    assert engine.info()["dtype"] == "float32"
    assert engine.generate(_prompts(engine, 3)[:1], TOP_K)[0].token_ids


# --------------------------------------------------------------------------- faults (fast)


def _corrupt(folder: Path, tiny_folder: Path) -> Path:
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tiny_folder / name).read_bytes())
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    return folder


def test_a_folder_mlx_cannot_load_is_an_engine_error(tiny_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=r"^MLX cannot load .*: \w+: "):
        MLXEngine(str(_corrupt(tmp_path / "bad", tiny_folder)))


@pytest.mark.parametrize(
    ("make", "code", "message"),
    [
        ("corrupt", 3, "MLX cannot load"),
        ("no_weights", 3, "MLX cannot load"),
        ("not_a_model", 2, "not a model folder (no config.json there)"),
        ("option", 2, "--engine-opt quantize=9: expected one of 2, 3, 4, 5, 6, 8"),
    ],
)
def test_faults_through_gate_run_are_one_line(
    tiny_folder: Path, tmp_path: Path, make: str, code: int, message: str
) -> None:
    folder = tmp_path / "m"
    if make == "corrupt":
        _corrupt(folder, tiny_folder)
    elif make == "no_weights":
        _corrupt(folder, tiny_folder)
        (folder / "model.safetensors").unlink()
    else:
        folder.mkdir()
    opts = ["--engine-opt", f"model_path={folder}"]
    if make == "option":
        (folder / "config.json").write_bytes((tiny_folder / "config.json").read_bytes())
        opts += ["--engine-opt", "quantize=9"]
    r = invoke(["run", "--engine", "mlx", *opts], env={"GATE_CACHE_DIR": str(tmp_path / "cache")})
    assert r.exit_code == code, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert "Traceback" not in r.output


# --------------------------------------------------------------------------- the default model (slow)


@pytest.fixture(scope="module")
def default_bf16() -> Iterator[MLXEngine]:
    pytest.importorskip("transformers")
    from gate.models.default import DEFAULT_MODEL

    engine = MLXEngine(DEFAULT_MODEL)
    yield engine
    engine.close()


@pytest.mark.slow
def test_the_default_model_greedy_is_mlx_lms_native_loop_token_for_token(default_bf16: MLXEngine) -> None:
    for p in _prompts(default_bf16, 32):
        rec = default_bf16.generate([p], TOP_K)[0]
        assert list(rec.token_ids) == _native(default_bf16.model, p.prompt_token_ids, len(rec.token_ids)), p.id
    rec = default_bf16.generate(_prompts(default_bf16, 12, ("The capital of France is",)), TOP_K)[0]
    assert rec.tokens is not None and "Paris" in "".join(rec.tokens)


@pytest.mark.slow
def test_the_default_model_forced_decode_through_the_cache_equals_a_fresh_full_forward(
    default_bf16: MLXEngine,
) -> None:
    """At a few positions, the forced decode's logits (decode steps on the KV cache, fed the
    engine's own tokens) against a fresh forward of the whole context, read at the last row."""
    p = _prompts(default_bf16, 24)[1]
    rec = default_bf16.generate([p], TOP_K)[0]
    forced = default_bf16.force(p.prompt_token_ids, rec.token_ids, TOP_K)
    assert forced.token_ids == rec.token_ids and forced.top_logprobs == rec.top_logprobs
    assert forced.top_logprobs is not None
    for i in (0, 5, 11, 23):
        ctx = [*p.prompt_token_ids, *rec.token_ids[:i]]
        logits = default_bf16.model(mx.array(ctx)[None])[:, -1, :]
        fresh = np.array(logits.astype(mx.float32)).reshape(-1)
        lse = float(np.log(np.exp(fresh.astype(np.float64) - fresh.max()).sum()) + fresh.max())
        for token, logprob in forced.top_logprobs[i]:
            assert abs((fresh[token] - lse) - logprob) < 0.13, (i, token)  # a bf16 step at |logit| < 32
        top2 = np.sort(fresh)[-2:]
        if top2[1] - top2[0] > 0.25:  # beyond two bf16 steps: the fresh pass picks the same token
            assert int(np.argmax(fresh)) == forced.token_ids[i], i


@pytest.mark.slow
def test_the_default_model_provenance_matches_the_pin(default_bf16: MLXEngine) -> None:
    from gate.core.pins.pin import load_pin
    from gate.workflows.common.provenance import check_prompt_tokens, model_hashes

    pin = load_pin(default_bf16.model_id, Path(__file__).parents[2] / "oracle_pins")
    check_prompt_tokens(default_bf16, pin)
    info = default_bf16.info()
    assert model_hashes(info)["weights_sha256"] == pin.provenance("weights_sha256")
    assert info["dtype"] == "bfloat16" and info["mlx"] and info["mlx_lm"] and info["device"]


@pytest.mark.slow
def test_gate_run_mlx_on_a_shard_of_the_default_pin(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    r = invoke(["run", "--engine", "mlx", "--shard", "1/8", "--format", "json", "--output", str(out)])
    assert r.exit_code in (0, 1), r.output
    report = json.loads(out.read_text())
    assert report["counts"]["prompts"] == 5 and report["counts"]["unadjudicated_positions"] == 0
