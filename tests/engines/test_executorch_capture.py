"""`gate diagnose` of the ExecuTorch engine through its own ETDump, named by the ETRecord gate's
export writes (gate/engines/executorch/etdump.py), on the tiny 2-layer Llama exported once:
the honest program is within the band everywhere it can be judged and the parts its XNNPACK
delegates hide are listed as missing; a fault planted in the shipped program's bytes (layer
1's MLP down-projection weights scaled inside the `.pte`) is located at layer 1's residual
stream and nowhere before; an older build without an ETRecord still runs and its capture is
one InputError line; a debug buffer too small for the run aborts the child process, not
gate's, and is one EngineError line."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("executorch")
pytest.importorskip("transformers")

from gate.core.diagnosis.capture import PREFILL
from gate.core.diagnosis.metric import MARGIN
from gate.core.engine import CapturesActivations, PromptInput
from gate.engines.executorch.cache import PTE_MANIFEST, PTE_NAME, program_dir, write_manifest
from gate.engines.executorch.export import ETRECORD_NAME
from gate.errors import EngineError, InputError
from gate.workflows.diagnose.core import GIVEN, NAMED_KIND, Target, capture_kind, diagnose_engine

pytestmark = pytest.mark.slow

LAYERS = 2
# Computed inside the XNNPACK delegates of gate's fp32 export of the tiny Llama: never logged.
HIDDEN = {f"model.layers.{i}.{p}" for i in range(LAYERS) for p in ("self_attn", "post_attention_layernorm", "mlp")}
HIDDEN.add("model.norm")
SEEN = {"model.embed_tokens", "lm_head"} | {
    f"model.layers.{i}{p}" for i in range(LAYERS) for p in ("", ".input_layernorm")
}


@pytest.fixture(scope="module")
def cache_dir(executorch_cache_dir: Path) -> Path:
    return executorch_cache_dir


@pytest.fixture(scope="module")
def honest(llama_path: Path, cache_dir: Path) -> Iterator[Any]:
    from gate.engines.executorch.engine import ExecuTorchEngine

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GATE_CACHE_DIR", str(cache_dir))
        engine = ExecuTorchEngine(str(llama_path), max_seq_len=64)
    yield engine
    engine.close()


def _target(engine: Any) -> Target:
    prompt = tuple(engine.encode("The capital of France is"))
    context = (*prompt, 72, 101, 108, 108, 111)
    return Target("p", len(context) - len(prompt), GIVEN, PREFILL, prompt, context)


def _copy_build(engine: Any, to: Path) -> Path:
    shutil.copytree(Path(engine.pte).parent, to)
    return to


def _rewrite_manifest(folder: Path, manifest: dict[str, Any], facts: dict[str, Any]) -> None:
    (folder / PTE_MANIFEST).unlink()
    write_manifest(folder, manifest["recipe"], manifest["source"], facts, attention=manifest["attention"])


def test_the_engine_is_captured_through_its_named_activations(honest: Any) -> None:
    assert isinstance(honest, CapturesActivations) and capture_kind(type(honest)) == NAMED_KIND
    assert (Path(honest.pte).parent / ETRECORD_NAME).is_file()
    assert ETRECORD_NAME in honest.manifest["files"]  # hashed: the build's check re-hashes it


def test_the_honest_program_is_within_the_band_and_the_hidden_parts_are_listed(honest: Any, llama_path: Path) -> None:
    diagnosis = diagnose_engine(honest, _target(honest), str(llama_path))
    finding = diagnosis.finding
    assert finding.first is None, finding.to_dict()
    assert {row.module for row in finding.layers} == SEEN
    assert set(finding.missing) == HIDDEN
    assert all(row.ratio <= MARGIN for row in finding.layers)


def test_a_fault_planted_in_the_shipped_program_is_located_at_its_layer(
    honest: Any, llama_path: Path, tmp_path: Path
) -> None:
    """Layer 1's MLP down-projection weights, scaled by 1.5 where the `.pte` stores them (its
    XNNPACK constant data, float32 as the checkpoint's): the runtime computes the fault; the
    MLP is inside a delegate, so the first point past the band is layer 1's residual stream."""
    import torch
    from transformers import AutoModelForCausalLM

    from gate.engines.executorch.engine import ExecuTorchEngine

    model = AutoModelForCausalLM.from_pretrained(str(llama_path), dtype=torch.float32)
    weight = model.model.layers[1].mlp.down_proj.weight.detach().numpy()
    raw = np.ascontiguousarray(weight, dtype="<f4").tobytes()
    folder = _copy_build(honest, tmp_path / "planted")
    data = (folder / PTE_NAME).read_bytes()
    assert data.count(raw) == 1
    planted = data.replace(raw, np.ascontiguousarray(weight * 1.5, dtype="<f4").tobytes())
    (folder / PTE_NAME).write_bytes(planted)
    _rewrite_manifest(folder, honest.manifest, honest.manifest["export"])
    engine = ExecuTorchEngine(str(llama_path), pte=str(folder / PTE_NAME))
    try:
        diagnosis = diagnose_engine(engine, _target(engine), str(llama_path))
    finally:
        engine.close()
    first = diagnosis.finding.first
    assert first is not None and first.module == "model.layers.1", diagnosis.finding.to_dict()
    before = {row.module: row.ratio for row in diagnosis.finding.layers}
    assert all(before[m] <= MARGIN for m in ("model.embed_tokens", "model.layers.0", "model.layers.1.input_layernorm"))


def test_a_build_without_an_etrecord_runs_and_its_capture_is_one_input_error(
    honest: Any, llama_path: Path, tmp_path: Path
) -> None:
    """A build made before the export wrote ETRecords: `gate run` still runs it; the capture
    says in one line what is missing and how to get it."""
    from gate.engines.executorch.engine import ExecuTorchEngine

    root = tmp_path / "cache"
    folder = _copy_build(honest, program_dir(llama_path, "fp32", 64, root / "models"))
    (folder / ETRECORD_NAME).unlink()
    facts = {k: v for k, v in honest.manifest["export"].items() if k != "etrecord"}
    _rewrite_manifest(folder, honest.manifest, facts)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GATE_CACHE_DIR", str(root))
        engine = ExecuTorchEngine(str(llama_path), max_seq_len=64)
    assert engine.pte == folder / PTE_NAME and engine.etrecord is None  # the old build, used as it is
    prompt = PromptInput("p", engine.encode("The capital of France is"), 4)
    assert engine.generate([prompt], 0)[0].token_ids == honest.generate([prompt], 0)[0].token_ids
    with pytest.raises(InputError) as caught:
        engine.capture_activations(list(prompt.prompt_token_ids))
    message = str(caught.value)
    assert "\n" not in message and "built without an ETRecord" in message and f"remove {folder}" in message
    engine.close()


def test_a_debug_buffer_too_small_is_one_engine_error_and_gate_goes_on(honest: Any, llama_path: Path) -> None:
    """1 MB holds less than the tiny program logs over 12 tokens (its KV-cache writes alone are
    whole caches): ExecuTorch aborts the child process; gate says so in one line and its own
    engine still decodes."""
    from gate.engines.executorch.engine import ExecuTorchEngine

    engine = ExecuTorchEngine(str(llama_path), pte=str(honest.pte), debug_buffer_mb=1)
    ids = list(range(3, 15))
    with pytest.raises(EngineError) as caught:
        engine.capture_activations(ids)
    message = str(caught.value)
    assert "\n" not in message and "ran out of its 1 MB debug buffer" in message and "SIGABRT" in message
    assert "--engine-opt debug_buffer_mb=N" in message
    prompt = PromptInput("p", tuple(ids), 3)
    assert engine.generate([prompt], 0)[0].token_ids == honest.generate([prompt], 0)[0].token_ids
    engine.close()


def test_a_buffer_gate_chose_that_runs_out_is_doubled_until_it_holds(honest: Any) -> None:
    """Without `debug_buffer_mb` a buffer that runs out is doubled (twice at most): 700 kB
    does not hold the tiny program's 5-token run (about 1.2 MB), twice that does."""
    from gate.engines.executorch.capture import layer_names, run_capture

    folder = Path(honest.pte).parent
    ids = [5, 6, 7, 8, 9]
    arrays, facts = run_capture(
        folder / PTE_NAME, folder / ETRECORD_NAME, ids, layer_names(LAYERS), first_bytes=700 << 10
    )
    assert facts["buffer_bytes"] == 1400 << 10 and facts["buffer_used_bytes"] > 700 << 10
    assert set(arrays) == SEEN


def test_a_given_programs_etrecord_that_does_not_match_its_manifest_is_refused(
    honest: Any, llama_path: Path, tmp_path: Path
) -> None:
    """A program given with `pte=` is read with the manifest beside it; its ETRecord, which
    no build check re-hashes there, is checked before the capture trusts its names."""
    from gate.engines.executorch.engine import ExecuTorchEngine

    folder = _copy_build(honest, tmp_path / "given")
    with open(folder / ETRECORD_NAME, "ab") as fh:
        fh.write(b"\0")
    engine = ExecuTorchEngine(str(llama_path), pte=str(folder / PTE_NAME))
    with pytest.raises(InputError, match="does not match its sha256"):
        engine.capture_activations([5, 6, 7])
    engine.close()
