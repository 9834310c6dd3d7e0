"""The ONNX Runtime GenAI engine: ONNX builds cached with a manifest (rebuilt when corrupt),
the runtime's greedy tie rule on the tiny tie model, forced decode, faults, and, marked slow,
the embedded default model's fp32 build against its pin."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime_genai")

from helpers.gate_cli import invoke

from gate.core.engine import PromptInput
from gate.core.traces.trace import PromptRecord, Trace, TraceHeader
from gate.core.verdict.adjudicate import compare
from gate.engines.ortgenai.builder import ONNX_MANIFEST, check_onnx_folder, onnx_model, write_manifest
from gate.errors import InputError

TOP_K = 4
TEXTS = ("import numpy as np", "The capital of France is", "1, 2, 3, 4,")


# --------------------------------------------------------------------------- the manifest (fast)


def _fake_build(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "genai_config.json").write_text("{}")
    (folder / "model.onnx").write_bytes(b"\x08\x07" * 100)
    write_manifest(folder, "fp32", {"path": "/src", "weights_sha256": "w" * 64})
    return folder


def test_the_manifest_catches_a_corrupt_missing_or_foreign_build(tmp_path: Path) -> None:
    folder = _fake_build(tmp_path / "m")
    assert check_onnx_folder(folder, source_weights_sha256="w" * 64) is None
    assert "other weights" in str(check_onnx_folder(folder, source_weights_sha256="x" * 64))
    (folder / "model.onnx").write_bytes(b"\x08\x07" * 99 + b"\x00\x00")
    assert check_onnx_folder(folder) == "model.onnx does not match its sha256"
    (folder / "model.onnx").unlink()
    assert check_onnx_folder(folder) == "model.onnx is missing"
    (folder / ONNX_MANIFEST).write_text("{")
    assert "unreadable" in str(check_onnx_folder(folder))


def test_a_bad_precision_or_source_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="precision=int8: expected one of fp32, int4"):
        onnx_model(tmp_path, "int8")
    with pytest.raises(InputError, match="not a Hugging Face model folder"):
        onnx_model(tmp_path, "fp32")


@pytest.mark.parametrize(
    ("make", "code", "message"),
    [
        ("no_config", 2, "no genai_config.json there"),
        ("garbage", 3, "engine 'ortgenai' failed to load"),
        ("option", 2, "--engine-opt precision=fp16: expected one of fp32, int4"),
    ],
)
def test_faults_through_gate_run_are_one_line(tmp_path: Path, make: str, code: int, message: str) -> None:
    folder = tmp_path / "onnx"
    folder.mkdir()
    opts = ["--engine-opt", f"model_path={folder}"]
    if make == "garbage":
        config = {
            "model": {
                "type": "llama",
                "vocab_size": 64,
                "context_length": 64,
                "eos_token_id": 2,
                "decoder": {
                    "filename": "model.onnx",
                    "head_size": 8,
                    "hidden_size": 16,
                    "num_attention_heads": 2,
                    "num_hidden_layers": 1,
                    "num_key_value_heads": 2,
                    "session_options": {"provider_options": []},
                },
            },
            "search": {"max_length": 64},
        }
        (folder / "genai_config.json").write_text(json.dumps(config))
        (folder / "model.onnx").write_bytes(b"this is not an onnx protobuf")
    elif make == "option":
        opts += ["--engine-opt", "precision=fp16"]
    r = invoke(["run", "--engine", "ortgenai", *opts])
    assert r.exit_code == code, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert "Traceback" not in r.output


# --------------------------------------------------------------------------- the tie model (slow: the builder)


@pytest.fixture(scope="module")
def tie_onnx(tie_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    pytest.importorskip("transformers")
    from gate.engines.ortgenai.engine import OrtGenAIEngine

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GATE_CACHE_DIR", str(tmp_path_factory.mktemp("gate-cache")))
        engine = OrtGenAIEngine(str(tie_model_path), threads=1)
        yield engine
    engine.close()


def _prompts(engine: object, n: int) -> list[PromptInput]:
    out = []
    for i, text in enumerate(TEXTS):
        ids = engine.encode(text)  # type: ignore[attr-defined]
        out.append(PromptInput(f"p{i}", ids, n, prompt=text))
    return out


@pytest.mark.slow
def test_the_runtime_breaks_exact_ties_toward_the_lowest_id(tie_onnx: object, tie_model_path: Path) -> None:
    """ONNX Runtime GenAI's CPU greedy search is `std::max_element`: the first maximum. On
    the tie model every position is an exact tie, so the lowest id must win everywhere, and
    the HF engine (torch.argmax) as oracle sees a strict pass."""
    from helpers.tiny_models import TIE_HIGH, TIE_LOW

    from gate.engines.hf.engine import HFEngine

    records = tie_onnx.generate(_prompts(tie_onnx, 6), TOP_K)  # type: ignore[attr-defined]
    for rec in records:
        assert set(rec.token_ids) == {TIE_LOW}
        assert rec.top_logprobs is not None
        for top in rec.top_logprobs:
            assert [top[0][0], top[1][0]] == [TIE_LOW, TIE_HIGH] and top[0][1] == top[1][1]
    oracle = HFEngine(str(tie_model_path), dtype="float32")
    o = oracle.generate(_prompts(oracle, 6), TOP_K)
    header = {"name": "x", "version": "test"}
    result = compare(
        Trace(TraceHeader("oracle", "tiny", TOP_K, header), tuple(o)),
        Trace(TraceHeader("candidate", "tiny", TOP_K, header), tuple(records)),
    )
    assert result.verdict == "strict_pass"


@pytest.mark.slow
def test_a_header_names_the_onnx_build_by_gates_cache(tie_onnx: object) -> None:
    from gate.core.storage.files import portable

    said = portable(tie_onnx.info())  # type: ignore[attr-defined]
    assert said["onnx_model_dir"].startswith("$GATE_CACHE/models/"), said["onnx_model_dir"]
    assert "/" not in said["onnx_model_dir"].removeprefix("$GATE_CACHE/models/")


@pytest.mark.slow
def test_forced_decode_on_its_own_tokens_reproduces_generate(tie_onnx: object) -> None:
    for rec in tie_onnx.generate(_prompts(tie_onnx, 5), TOP_K):  # type: ignore[attr-defined]
        forced = tie_onnx.force(rec.prompt_token_ids, rec.token_ids, TOP_K)  # type: ignore[attr-defined]
        assert forced.token_ids == rec.token_ids and forced.top_logprobs == rec.top_logprobs


@pytest.mark.slow
def test_a_corrupt_cached_build_is_rebuilt(tie_model_path: Path, tmp_path: Path) -> None:
    messages: list[str] = []
    folder = onnx_model(tie_model_path, "fp32", cache_dir=tmp_path, log=messages.append)
    assert len(messages) == 1 and "building the ONNX model" in messages[0]
    manifest = json.loads((folder / ONNX_MANIFEST).read_text())
    assert manifest["precision"] == "fp32" and manifest["source"]["weights_sha256"]
    assert set(manifest["files"]) >= {"model.onnx", "genai_config.json"}
    assert onnx_model(tie_model_path, "fp32", cache_dir=tmp_path, log=messages.append) == folder
    assert len(messages) == 1  # reused, not rebuilt
    data = folder / "genai_config.json"
    data.write_text(data.read_text().replace('"context_length"', '"context_length" ', 1))
    onnx_model(tie_model_path, "fp32", cache_dir=tmp_path, log=messages.append)
    assert len(messages) == 2 and "genai_config.json does not match its sha256" in messages[1]
    assert check_onnx_folder(folder) is None


# --------------------------------------------------------------------------- the default model (slow)


@pytest.fixture(scope="module")
def default_fp32() -> Iterator[object]:
    pytest.importorskip("transformers")
    from gate.engines.ortgenai.engine import OrtGenAIEngine
    from gate.models.default import DEFAULT_MODEL

    engine = OrtGenAIEngine(DEFAULT_MODEL, precision="fp32", threads=1)
    yield engine
    engine.close()


@pytest.mark.slow
def test_the_default_build_tokenizes_every_pinned_prompt_as_the_pin(default_fp32: object) -> None:
    from gate.core.pins.pin import load_pin
    from gate.workflows.common.provenance import check_prompt_tokens as check_prompt_ids
    from gate.workflows.common.provenance import model_hashes

    pin = load_pin(default_fp32.model_id, Path(__file__).parents[2] / "oracle_pins")  # type: ignore[attr-defined]
    check_prompt_ids(default_fp32, pin)  # type: ignore[arg-type]
    info = default_fp32.info()  # type: ignore[attr-defined]
    # built from the pin's own weights: the provenance check compares them and passes
    assert model_hashes(info)["weights_sha256"] == pin.provenance("weights_sha256")
    assert info["precision"] == "fp32" and info["onnx_model_sha256"]


@pytest.mark.slow
def test_the_default_build_forced_decode_reproduces_generate(default_fp32: object) -> None:
    ids = default_fp32.encode("The capital of France is")  # type: ignore[attr-defined]
    rec = default_fp32.generate([PromptInput("p", ids, 12)], 5)[0]  # type: ignore[attr-defined]
    assert rec.tokens is not None and "Paris" in "".join(rec.tokens)
    forced = default_fp32.force(ids, rec.token_ids, 5)  # type: ignore[attr-defined]
    assert forced.token_ids == rec.token_ids and forced.top_logprobs == rec.top_logprobs
    other = (rec.token_ids[0] + 1, *rec.token_ids[1:])
    moved = default_fp32.force(ids, other, 5)  # type: ignore[attr-defined]
    assert moved.top_logprobs[0] == rec.top_logprobs[0] and moved.top_logprobs[1] != rec.top_logprobs[1]
    assert replace(rec, top_logprobs=None).token_ids == forced.token_ids


@pytest.mark.slow
def test_batched_decoding_is_the_one_prompt_loop_bit_for_bit(default_fp32: object) -> None:
    """`batch_size` N decodes prompts together (right padding with the pad id); a chat
    prompt holds the pad id inside it, and a prompt that ends with it cannot be told from
    padding, so it runs alone. Each prompt's record is the batch-of-one record."""
    from gate.core.pins.pin import load_pin
    from gate.engines.ortgenai.engine import OrtGenAIEngine

    pin = load_pin(default_fp32.model_id, Path(__file__).parents[2] / "oracle_pins")  # type: ignore[attr-defined]
    pad = default_fp32.pad_token_id  # type: ignore[attr-defined]
    recs = list(pin.trace.records[:5])
    chat = next(r for r in pin.trace.records if pad in r.prompt_token_ids[:-1])
    cut = list(chat.prompt_token_ids).index(pad) + 1
    prompts = [PromptInput(r.id, r.prompt_token_ids, 6 + 2 * i) for i, r in enumerate([*recs, chat])]
    prompts.append(PromptInput("ends-with-pad", chat.prompt_token_ids[:cut], 5))
    alone = default_fp32.generate(prompts, 5)  # type: ignore[attr-defined]
    batched_engine = OrtGenAIEngine(default_fp32.model_id, precision="fp32", threads=1, batch_size=4)  # type: ignore[attr-defined]
    alone_calls: list[str] = []
    one = batched_engine._generate_one

    def counted(p: PromptInput, k: int) -> PromptRecord:
        alone_calls.append(p.id)
        return one(p, k)

    batched_engine._generate_one = counted  # type: ignore[method-assign,assignment]
    try:
        together = batched_engine.generate(prompts, 5)
        assert batched_engine.info()["batch_size"] == 4
        assert alone_calls == ["ends-with-pad"]  # the other six went through two batches
    finally:
        batched_engine.close()
    assert [r.id for r in together] == [p.id for p in prompts]
    for a, b in zip(alone, together, strict=True):
        assert (a.token_ids, a.top_logprobs, a.finish_reason) == (b.token_ids, b.top_logprobs, b.finish_reason), a.id


@pytest.mark.slow
def test_gate_run_ortgenai_on_a_shard_of_the_default_pin(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    r = invoke(
        ["run", "--engine", "ortgenai", "--engine-opt", "threads=1", "--shard", "1/8",
         "--format", "json", "--output", str(out)]
    )  # fmt: skip
    assert r.exit_code in (0, 1), r.output
    report = json.loads(out.read_text())
    assert report["counts"]["prompts"] == 5 and report["counts"]["unadjudicated_positions"] == 0
