"""`HFEngine(..., tokenizer=False)`: the ids-only engine gate diagnose loads for its reference
and honest band: no tokenizer, the same logits; the option is Python's only, never an
--engine-opt (slow: loads a tiny model)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_an_ids_only_engine_loads_no_tokenizer_and_computes_the_same(llama_path: Path) -> None:
    import torch

    from gate.engines.hf.engine import HFEngine

    full, bare = HFEngine(str(llama_path)), HFEngine(str(llama_path), tokenizer=False)
    assert full.tokenizer is not None and bare.tokenizer is None
    assert "tokenizer" not in bare.options
    ids = [40, 41, 42, 43]
    with torch.inference_mode():
        assert torch.equal(full._prefill(ids)[0], bare._prefill(ids)[0])


def test_tokenizer_as_an_engine_opt_string_is_still_an_unknown_option(llama_path: Path) -> None:
    from gate.engines.hf.engine import HFEngine
    from gate.errors import InputError

    with pytest.raises(InputError, match="unknown option"):
        HFEngine(str(llama_path), tokenizer="false")
