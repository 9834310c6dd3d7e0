"""Fixtures of the engine tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.fake_openai_server import FakeOpenAIServer


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    """A fake OpenAI-compatible server on 127.0.0.1 (tests/helpers/fake_openai_server.py)."""
    with FakeOpenAIServer() as srv:
        yield srv


@pytest.fixture(scope="session")
def executorch_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One gate cache for the ExecuTorch tests: the tiny Llama's programs are exported once
    for the session (each test that changes a build changes a copy)."""
    return tmp_path_factory.mktemp("gate-cache-executorch")


@pytest.fixture(scope="session")
def tiny_executorch(llama_path: Path, executorch_cache_dir: Path) -> Iterator[Any]:
    """The tiny Llama (lm_head x20: clear margins) exported to fp32 once for the session, its
    ETRecord beside it."""
    from gate.engines.executorch.engine import ExecuTorchEngine

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GATE_CACHE_DIR", str(executorch_cache_dir))
        engine = ExecuTorchEngine(str(llama_path), max_seq_len=64)
    yield engine
    engine.close()
