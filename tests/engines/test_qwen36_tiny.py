"""gate's Qwen3.6 test checkpoint (`gate-llm/Qwen3.6-tiny`: Gated DeltaNet + gated attention,
MoE with a shared expert) on every engine that runs its architecture here: hf (the multimodal
checkpoint as a causal LM), llamacpp and llama-server (its GGUF), mlx (its mlx-lm folder).

Each engine forced along its own free path reproduces its free run (a recurrent state is never
cropped: each forced decode starts from a cleared state, or the server keeps one that only ever
grows), an honest build passes against the committed pin, and a planted DeltaNet fault fails.
vLLM and ExecuTorch refuse the architecture in one line (exit 3) before any long work.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.gate_cli import invoke
from helpers.llama_servers import llama_server_binary

from gate.core.engine import Engine, PromptInput
from gate.core.pins.pin import load_pin
from gate.engines.registry import load_engine
from gate.models.qwen_tiny import QWEN_TINY, gguf_path, qwen_tiny_dir

pytestmark = pytest.mark.slow


def have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# Three pinned prompts: code, prose and a chat-templated one (the default suite's).
PROMPT_IDS = ("code-numpy", "prose-fox", "chat-capital")


def _prompts() -> list[PromptInput]:
    pin = load_pin(QWEN_TINY)
    by_id = {r.id: r for r in pin.trace.records}
    chosen = [i for i in PROMPT_IDS if i in by_id] or [r.id for r in pin.trace.records[:3]]
    return [PromptInput(id=i, prompt_token_ids=by_id[i].prompt_token_ids, max_tokens=16) for i in chosen]


ENGINES = [
    pytest.param(("hf", {}), id="hf"),
    pytest.param(
        ("llamacpp", {"preflight": "false"}),
        id="llamacpp",
        marks=pytest.mark.skipif(not have("llama_cpp"), reason="no llama-cpp-python"),
    ),
    pytest.param(
        ("llama-server", {"threads": "1"}),
        id="llama-server",
        marks=pytest.mark.skipif(llama_server_binary() is None, reason="no llama-server"),
    ),
    pytest.param(("mlx", {}), id="mlx", marks=pytest.mark.skipif(not have("mlx_lm"), reason="no mlx-lm")),
]


@pytest.fixture(scope="module", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    name, opts = request.param
    eng = load_engine(name, QWEN_TINY, opts)
    try:
        yield eng
    finally:
        eng.close()


def test_forced_along_its_own_free_path_it_reproduces_its_free_run(engine: Engine) -> None:
    from gate.core.engine import ForcesDecode

    assert isinstance(engine, ForcesDecode)
    prompts = _prompts()
    free = engine.generate(prompts, 5)
    # Twice, in another order: a state left over from the previous request would show.
    for rec in [*free, *reversed(free)]:
        forced = engine.force(rec.prompt_token_ids, rec.token_ids, 5)
        assert forced.token_ids == rec.token_ids, rec.id
        if forced.top_logprobs is not None and rec.top_logprobs is not None:
            assert [[t for t, _ in p] for p in forced.top_logprobs] == [[t for t, _ in p] for p in rec.top_logprobs]
    again = engine.generate(prompts, 5)
    assert [r.token_ids for r in again] == [r.token_ids for r in free]


def test_its_free_runs_are_the_pinned_text_not_noise(engine: Engine) -> None:
    """The distilled checkpoint continues the suite as its teacher did: the first tokens agree
    with the pin on most prompts (a random initialisation agrees on none)."""
    pin = load_pin(QWEN_TINY)
    by_id = {r.id: r for r in pin.trace.records}
    free = engine.generate(_prompts(), 0)
    agree = sum(r.token_ids[:4] == by_id[r.id].token_ids[:4] for r in free)
    assert agree >= 2, [(r.id, r.token_ids[:4], by_id[r.id].token_ids[:4]) for r in free]


# --------------------------------------------------------------------------- gate run


def _run(*args: str) -> dict[str, Any]:
    r = invoke(["run", "--model", QWEN_TINY, *args, "--format", "json"])
    assert r.exit_code in (0, 1), r.stderr[-2000:]
    report: dict[str, Any] = json.loads(r.stdout)
    assert report["counts"]["prompts"] == 41 and report["oracle_engine"] == "hf"
    return report


def test_the_reference_implementation_passes_its_own_pin_bit_for_bit_on_its_machine_else_by_the_doctrine() -> None:
    """The pin's engine (transformers bf16, one thread) on the pin's kernel path passes it
    strictly; on another (an AVX2-only AMD EPYC beside the AMX Xeon that recorded it: other
    bf16 matmul kernels) its moves are near ties, ratified, and none a defect."""
    report = _run("--engine", "hf", "--engine-opt", "threads=1")
    machine = report["machine"]
    assert machine["pin"] == "cpu:AVX512+amx", machine
    if machine["same"] is True:
        assert report["verdict"] == "strict_pass", report["summary"]
    else:
        assert report["verdict"] in ("strict_pass", "ratified_pass"), report["summary"]
        assert report["counts"]["defects"] == 0, report["counts"]


@pytest.mark.parametrize(
    ("engine_name", "opts"),
    [
        pytest.param("hf", ["--engine-opt", "threads=1", "--engine-opt", "dtype=float32"], id="hf-float32"),
        pytest.param(
            "llamacpp",
            ["--engine-opt", "threads=1"],
            id="llamacpp",
            marks=pytest.mark.skipif(not have("llama_cpp"), reason="no llama-cpp-python"),
        ),
        pytest.param(
            "llama-server",
            ["--engine-opt", "threads=1"],
            id="llama-server",
            marks=pytest.mark.skipif(llama_server_binary() is None, reason="no llama-server"),
        ),
        pytest.param("mlx", [], id="mlx", marks=pytest.mark.skipif(not have("mlx_lm"), reason="no mlx-lm")),
    ],
)
def test_an_honest_build_passes(engine_name: str, opts: list[str]) -> None:
    """transformers in float32, llama.cpp (bf16 weights, float32 arithmetic), its server and MLX
    (float32) are honest builds of the bf16 pin's weights: each passes, every divergence a tie.
    (The first build of the checkpoint failed all four at one position, where a router near tie
    flipped an expert between bf16 and float32: docs/results/qwen36-tiny.md.)"""
    report = _run("--engine", engine_name, *opts)
    assert report["verdict"] in ("strict_pass", "ratified_pass"), report["reason"]
    assert report["exit_code"] == 0 and report["counts"]["defects"] == 0


def test_a_planted_deltanet_fault_fails_on_hf() -> None:
    """Layer 0's DeltaNet output projection scaled by 1.5 after loading (the weights on disk
    are the pin's, so their hash passes the provenance check)."""
    engine = "helpers.planted_deltanet:DeltaNetOutScale"
    r = invoke(["run", "--model", QWEN_TINY, "--engine", engine, "--format", "json"])
    assert r.exit_code == 1, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["verdict"] == "fail" and report["counts"]["defects"] > 0


@pytest.mark.skipif(not have("llama_cpp"), reason="no llama-cpp-python")
def test_a_planted_deltanet_fault_fails_on_llamacpp(tmp_path: Path) -> None:
    """The GGUF with the sign of layer 0's DeltaNet output projection flipped (bf16: bit 15)."""
    from gguf import GGUFReader

    faulted = tmp_path / "faulted.gguf"
    shutil.copyfile(gguf_path(), faulted)
    reader = GGUFReader(faulted, "r+")
    [tensor] = [t for t in reader.tensors if t.name == "blk.0.ssm_out.weight"]
    data = tensor.data.view(np.uint16)
    data ^= np.uint16(0x8000)
    del reader
    r = invoke(
        [
            "run",
            "--model",
            QWEN_TINY,
            "--engine",
            "llamacpp",
            "--engine-opt",
            f"model_path={faulted}",
            "--format",
            "json",
        ]
    )
    assert r.exit_code == 1, r.stderr[-2000:]
    assert json.loads(r.stdout)["verdict"] == "fail"


# --------------------------------------------------------------------------- refusals


@pytest.mark.skipif(not have("vllm"), reason="no vllm")
def test_vllm_refuses_the_architecture_in_one_line() -> None:
    r = invoke(["run", "--model", QWEN_TINY, "--engine", "vllm"])
    assert r.exit_code == 3, r.stderr
    [line] = [x for x in r.stderr.splitlines() if x.startswith("gate: error")]
    assert "'vllm'" in line and "Qwen3_5MoeForConditionalGeneration" in line and "cannot import" in line


@pytest.mark.skipif(not have("vllm"), reason="no vllm")
def test_pin_record_with_vllm_refuses_and_names_the_reference_oracle(tmp_path: Path) -> None:
    pins = tmp_path / "pins" / "gate-llm" / "Qwen3.6-tiny"
    pins.mkdir(parents=True)
    shutil.copyfile(load_pin(QWEN_TINY).folder.suite_path, pins / "suite.jsonl")
    r = invoke(["pin", "record", "--model", QWEN_TINY, "--pins-dir", str(tmp_path / "pins"), "--oracle", "vllm"])
    assert r.exit_code == 3, r.stderr
    [line] = [x for x in r.stderr.splitlines() if x.startswith("gate: error")]
    assert "Qwen3_5MoeForConditionalGeneration" in line and "--oracle transformers --dtype" in line
    assert not (pins / "pin.jsonl").exists()


@pytest.mark.skipif(not have("executorch"), reason="no executorch")
def test_executorch_refuses_the_architecture_in_one_line() -> None:
    r = invoke(["run", "--model", QWEN_TINY, "--engine", "executorch"])
    assert r.exit_code == 3, r.stderr
    [line] = [x for x in r.stderr.splitlines() if x.startswith("gate: error")]
    assert "'executorch'" in line and "Qwen3_5MoeForConditionalGeneration" in line


@pytest.mark.skipif(not have("onnxruntime_genai"), reason="no onnxruntime-genai")
def test_ortgenai_refuses_the_architecture_in_one_line() -> None:
    r = invoke(["run", "--model", QWEN_TINY, "--engine", "ortgenai"])
    assert r.exit_code == 3, r.stderr
    [line] = [x for x in r.stderr.splitlines() if x.startswith("gate: error")]
    assert "'ortgenai'" in line and "Qwen3_5MoeForConditionalGeneration" in line


def test_hf_loads_the_multimodal_checkpoint_as_its_text_model() -> None:
    """AutoModelForCausalLM reads the multimodal checkpoint as Qwen3_5MoeForCausalLM with the
    language model's weights: its logits are the full model's, bit for bit (the vision tower unused)."""
    import torch
    from transformers import Qwen3_5MoeForConditionalGeneration

    eng = load_engine("hf", QWEN_TINY, {})
    try:
        assert eng.info()["architecture"] == "Qwen3_5MoeForCausalLM"
        full = Qwen3_5MoeForConditionalGeneration.from_pretrained(qwen_tiny_dir(), dtype=torch.bfloat16).eval()
        ids = torch.tensor([list(_prompts()[0].prompt_token_ids)])
        with torch.no_grad():
            assert torch.equal(eng.model(input_ids=ids).logits, full(input_ids=ids).logits)  # type: ignore[attr-defined]
    finally:
        eng.close()
