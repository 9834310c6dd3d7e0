"""The ExecuTorch engine: a tiny Llama exported through gate's export path (KV cache, XNNPACK)
decodes as transformers does, forced decode through the program's cache, the cached build's
manifest, faults (a missing or corrupt `.pte`: exit 2 or 3, one line), and, marked `export` (left
out of the default run: `pytest -m export`), the embedded default model's fp32 program against its
pin (exported once per session: 6-12 minutes of graph passes on one core)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("executorch")
pytest.importorskip("transformers")

from helpers.gate_cli import invoke

from gate.core.engine import PromptInput
from gate.core.storage.files import file_sha256
from gate.engines.executorch.cache import PTE_MANIFEST, PTE_NAME, check_program_folder, executorch_program
from gate.errors import InputError

TOP_K = 5
TEXTS = ("import numpy as np", "The capital of France is", "1, 2, 3, 4,", "<|im_start|>user\nhi")


@pytest.fixture(scope="module")
def cache_dir(executorch_cache_dir: Path) -> Path:
    return executorch_cache_dir


@pytest.fixture(scope="module")
def tiny(llama_path: Path, cache_dir: Path) -> Iterator[Any]:
    """The tiny Llama (lm_head x20: clear margins) exported to fp32 once for the module."""
    from gate.engines.executorch.engine import ExecuTorchEngine

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GATE_CACHE_DIR", str(cache_dir))
        engine = ExecuTorchEngine(str(llama_path), max_seq_len=64)
        yield engine
    engine.close()


@pytest.fixture(scope="module")
def oracle(llama_path: Path) -> Any:
    from gate.engines.hf.engine import HFEngine

    return HFEngine(str(llama_path), dtype="float32")


def _prompts(engine: Any, n: int) -> list[PromptInput]:
    return [PromptInput(f"p{i}", engine.encode(t), n, prompt=t) for i, t in enumerate(TEXTS)]


def test_greedy_and_logprobs_match_transformers_float32(tiny: Any, oracle: Any) -> None:
    ours = tiny.generate(_prompts(tiny, 12), TOP_K)
    theirs = oracle.generate(_prompts(oracle, 12), TOP_K)
    for a, b in zip(ours, theirs, strict=True):
        assert a.prompt_token_ids == b.prompt_token_ids
        assert a.token_ids == b.token_ids, a.id
        assert a.finish_reason == b.finish_reason
        assert a.top_logprobs is not None and b.top_logprobs is not None
        for mine, ref in zip(a.top_logprobs, b.top_logprobs, strict=True):
            assert [t for t, _ in mine] == [t for t, _ in ref]
            assert all(abs(x - y) < 1e-3 for (_, x), (_, y) in zip(mine, ref, strict=True))


def test_forced_decode_on_its_own_tokens_is_the_free_run_bit_for_bit(tiny: Any) -> None:
    for rec in tiny.generate(_prompts(tiny, 10), TOP_K):
        forced = tiny.force(rec.prompt_token_ids, rec.token_ids, TOP_K)
        assert forced.mode == "decode"
        assert forced.token_ids == rec.token_ids
        assert list(forced.top_logprobs) == list(rec.top_logprobs)


def test_forced_decode_feeds_the_oracles_tokens_through_the_cache(tiny: Any, oracle: Any) -> None:
    """Feeding tokens the engine would not pick moves every later position as it moves
    transformers': the program's cache holds the fed tokens, not its own picks."""
    prompt = tiny.encode(TEXTS[1])
    fed = tuple(tiny.encode(" the quick brown fox jumps"))
    ours = tiny.force(prompt, fed, TOP_K)
    theirs = oracle.force(prompt, fed, TOP_K)
    assert ours.token_ids == theirs.token_ids
    own = tiny.generate([PromptInput("p", prompt, len(fed))], 0)[0].token_ids
    assert ours.token_ids != own  # the fed tokens did change what follows


def test_a_new_prompt_reads_nothing_of_the_previous_ones_cache(tiny: Any) -> None:
    long, short = _prompts(tiny, 8)[3], _prompts(tiny, 8)[0]
    alone = tiny.generate([short], TOP_K)[0]
    after = tiny.generate([long, short], TOP_K)[1]
    assert after.token_ids == alone.token_ids and after.top_logprobs == alone.top_logprobs


def test_the_header_names_the_program_and_the_weights_it_came_from(tiny: Any, llama_path: Path) -> None:
    from gate.models.hashing import source_hashes

    info = tiny.info()
    assert info["name"] == "executorch" and info["executorch"] == info["version"]
    assert info["recipe"] == "fp32" and info["backend"] == "XNNPACK"
    assert info["pte_sha256"] == file_sha256(info["pte"])
    assert info["weights_sha256"] == source_hashes(llama_path)["weights_sha256"]
    assert info["max_seq_len"] == 64 and info["prefill_tokens_per_call"] == 64
    assert info["export"]["delegated_ops"]["delegate_calls"] >= 1


def test_a_prompt_longer_than_the_cache_is_refused_by_name(tiny: Any) -> None:
    prompt = PromptInput("long", tuple(range(60)), 10)
    with pytest.raises(InputError, match="'long': 60 prompt tokens and 10 to generate need 69 cache positions"):
        tiny.generate([prompt], 0)


def test_a_second_use_reuses_the_build_and_a_corrupt_one_is_caught(tiny: Any, tmp_path: Path) -> None:
    folder = Path(tiny.info()["pte"]).parent
    before = (folder / PTE_MANIFEST).stat().st_mtime_ns
    said: list[str] = []
    source = tiny.source
    assert executorch_program(source, "fp32", 64, cache_dir=folder.parent, log=said.append) == folder
    assert said == [] and (folder / PTE_MANIFEST).stat().st_mtime_ns == before
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    assert check_program_folder(copy) is None
    data = bytearray((copy / PTE_NAME).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / PTE_NAME).write_bytes(bytes(data))
    assert check_program_folder(copy) == f"{PTE_NAME} does not match its sha256"
    assert "other weights" in str(check_program_folder(folder, source_weights_sha256="0" * 64))


def test_the_8da4w_recipe_exports_and_decodes(llama_path: Path, cache_dir: Path, tiny: Any) -> None:
    """The quantised recipe goes through the same path: int4 weights move the logits a
    little, so the tokens agree with fp32's at most positions, not all."""
    from gate.engines.executorch.engine import ExecuTorchEngine

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GATE_CACHE_DIR", str(cache_dir))
        engine = ExecuTorchEngine(str(llama_path), recipe="8da4w", max_seq_len=64)
    info = engine.info()
    assert info["recipe"] == "8da4w" and info["export"]["group_size"] == 32
    assert info["pte_sha256"] != tiny.info()["pte_sha256"]
    quant = engine.generate(_prompts(engine, 8), TOP_K)
    full = tiny.generate(_prompts(tiny, 8), TOP_K)
    pairs = [(a, b) for q, f in zip(quant, full, strict=True) for a, b in zip(q.token_ids, f.token_ids, strict=False)]
    same = sum(a == b for a, b in pairs)
    assert same >= len(full) * 8 // 2
    engine.close()


def test_the_custom_sdpa_attention_decodes_as_the_masked_one(llama_path: Path, cache_dir: Path, tiny: Any) -> None:
    """ExecuTorch's own `llama.update_cache` and `llama.custom_sdpa` in place of the masked
    attention over the whole cache: the same float32 computation, a program of its own
    (another folder, another sha256; the masked build is never taken for it), the same
    tokens and logprobs within float32 noise, and its forced decode its free run bit for bit."""
    from gate.engines.executorch.engine import ExecuTorchEngine

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GATE_CACHE_DIR", str(cache_dir))
        engine = ExecuTorchEngine(str(llama_path), max_seq_len=64, attention="custom_sdpa")
    info = engine.info()
    assert info["attention"] == "custom_sdpa" and tiny.info()["attention"] == "masked"
    assert info["pte_sha256"] != tiny.info()["pte_sha256"]
    assert info["export"]["delegated_ops"]["portable_ops"] < tiny.info()["export"]["delegated_ops"]["portable_ops"]
    masked_folder = Path(tiny.info()["pte"]).parent
    assert Path(info["pte"]).parent != masked_folder
    assert "attention 'masked', not 'custom_sdpa'" in str(check_program_folder(masked_folder, attention="custom_sdpa"))
    ours = engine.generate(_prompts(engine, 12), TOP_K)
    theirs = tiny.generate(_prompts(tiny, 12), TOP_K)
    for a, b in zip(ours, theirs, strict=True):
        assert a.token_ids == b.token_ids, a.id
        assert a.top_logprobs is not None and b.top_logprobs is not None
        for mine, ref in zip(a.top_logprobs, b.top_logprobs, strict=True):
            assert [t for t, _ in mine] == [t for t, _ in ref]
            assert all(abs(x - y) < 1e-3 for (_, x), (_, y) in zip(mine, ref, strict=True))
        forced = engine.force(a.prompt_token_ids, a.token_ids, TOP_K)
        assert forced.token_ids == a.token_ids and list(forced.top_logprobs) == list(a.top_logprobs)
    long, short = _prompts(engine, 8)[3], _prompts(engine, 8)[0]
    alone = engine.generate([short], TOP_K)[0]
    after = engine.generate([long, short], TOP_K)[1]
    assert after.token_ids == alone.token_ids and after.top_logprobs == alone.top_logprobs
    # gate diagnose's capture runs this program too: its child registers the LLM operators
    captured = engine.capture_activations(list(short.prompt_token_ids), ["model.layers.0", "model.layers.1"])
    assert set(captured) == {"model.layers.0", "model.layers.1"}
    engine.close()


# --------------------------------------------------------------------------- faults (one line)


def _one_line(r: Any, code: int, message: str) -> None:
    assert r.exit_code == code, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert "Traceback" not in r.output


def test_a_missing_pte_is_exit_2_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pte"
    r = invoke(["run", "--engine", "executorch", "--engine-opt", f"pte={missing}"])
    _one_line(r, 2, f"--engine-opt pte={missing}: no such file")


def test_a_corrupt_pte_is_exit_3_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "model.pte"
    bad.write_bytes(b"\x00" * 16 + b"this is not an ExecuTorch program" * 10)
    r = invoke(["run", "--engine", "executorch", "--engine-opt", f"pte={bad}"])
    _one_line(r, 3, f"ExecuTorch cannot load {bad}")


def test_a_truncated_program_is_exit_3_in_one_line(tiny: Any, tmp_path: Path) -> None:
    cut = tmp_path / "cut.pte"
    data = Path(tiny.info()["pte"]).read_bytes()
    cut.write_bytes(data[: len(data) // 3])
    r = invoke(["run", "--engine", "executorch", "--engine-opt", f"pte={cut}"])
    _one_line(r, 3, f"ExecuTorch cannot load {cut}")


LOAD = (
    "import sys\nfrom executorch.runtime import Runtime, Verification\n"
    "Runtime.get().load_program(sys.argv[1], verification=Verification.Minimal).load_method('forward')\n"
)


def test_a_program_that_crashes_the_runtime_is_exit_3_in_one_line_and_gate_lives(tmp_path: Path) -> None:
    """A `.pte` with ExecuTorch's file identifier and a body of noise: the runtime, which does
    not check a program past its header, dies on some of them (SIGSEGV) in the process that
    loads it. gate loads a program it did not build in a child process first."""
    import random
    import subprocess
    import sys

    crashing = None
    for seed in range(12):
        bad = tmp_path / f"noise{seed}.pte"
        bad.write_bytes((16).to_bytes(4, "little") + b"ET12" + random.Random(seed).randbytes(2000))
        done = subprocess.run([sys.executable, "-c", LOAD, str(bad)], capture_output=True, timeout=120, check=False)
        if done.returncode < 0:
            crashing = bad
            break
    assert crashing is not None, "no noise program crashes this ExecuTorch: the test needs one that does"
    r = invoke(["run", "--engine", "executorch", "--engine-opt", f"pte={crashing}"])
    _one_line(r, 3, f"ExecuTorch cannot load {crashing}: the runtime was killed by SIG")


@pytest.mark.parametrize(
    ("opt", "message"),
    [
        ("recipe=int8", "--engine-opt recipe=int8: expected one of fp32, 8da4w"),
        ("max_seq_len=x", "--engine-opt max_seq_len=x: expected int"),
        ("colour=red", "--engine-opt colour: unknown option for engine 'executorch'"),
    ],
)
def test_a_bad_option_is_exit_2_in_one_line(opt: str, message: str) -> None:
    _one_line(invoke(["run", "--engine", "executorch", "--engine-opt", opt]), 2, message)


# --------------------------------------------------------------------------- the default model (slow)


@pytest.fixture(scope="session")
def default_fp32() -> Iterator[Any]:
    """The default model's fp32 program, exported once (2-3 minutes) into gate's own cache,
    so `gate run --engine executorch` after the tests reuses it."""
    from gate.engines.executorch.engine import ExecuTorchEngine

    engine = ExecuTorchEngine("HuggingFaceTB/SmolLM2-135M-Instruct", threads=1)
    yield engine
    engine.close()


@pytest.mark.slow
@pytest.mark.export
def test_the_default_model_gets_a_verdict_through_gate_run(default_fp32: Any, tmp_path: Path) -> None:
    """One shard of the suite (the whole suite is the results page's run: 7 minutes here),
    through the CLI, on the program the fixture exported into gate's cache."""
    import json

    out = tmp_path / "et.json"
    args = ["run", "--engine", "executorch", "--engine-opt", "threads=1", "--shard", "1/8"]
    r = invoke([*args, "--format", "json", "-o", str(out)])
    report = json.loads(out.read_text())
    assert r.exit_code == report["exit_code"] == 0, r.output
    assert report["candidate_engine"] == "executorch"
    assert report["counts"]["unadjudicated_positions"] == 0 and report["counts"]["defects"] == 0
    assert report["verdict"] in ("strict_pass", "ratified_pass")


@pytest.mark.slow
@pytest.mark.export
def test_the_default_program_forces_its_own_tokens_bit_for_bit(default_fp32: Any) -> None:
    from gate.models.default import materialize_default
    from gate.models.hashing import source_hashes

    engine = default_fp32
    info = engine.info()
    assert info["weights_sha256"] == source_hashes(materialize_default())["weights_sha256"]
    assert info["pte_sha256"] == file_sha256(info["pte"])
    for rec in engine.generate(_prompts(engine, 16)[:2], TOP_K):
        forced = engine.force(rec.prompt_token_ids, rec.token_ids, TOP_K)
        assert forced.token_ids == rec.token_ids
        assert list(forced.top_logprobs) == list(rec.top_logprobs)
