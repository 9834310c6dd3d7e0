"""The greedy check (is the candidate's choice a maximum of its own list, within one float32
rounding?) gives one answer whichever form the lists arrive in: the reader's arrays take a
vectorised path, lists built in memory a loop. The vectorised slack was one float32 step at
the logprob's own size, uncapped, where `logprob_slack` caps the size at 128 (no honest
logprob is larger): a list at -3e38 had a slack of 2e31 nats on the fast path, so any
choice in it read as greedy."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.core.traces.trace import TopLogprobs
from gate.core.verdict.own_lists import greedy_breaks

K = 4
bases = st.sampled_from([0.0, 1.0, 50.0, 200.0, 1e6, 1e30, 3.0e38])
spreads = st.sampled_from([1e-7, 1e-5, 1e-3, 1.0, 1e20, 1e30])


def _list(raw: list[float], base: float, spread: float) -> list[list[float]]:
    pairs = [[t, -(base + x * spread)] for t, x in enumerate(raw)]
    return sorted(pairs, key=lambda p: (-p[1], p[0]))


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=K, max_size=K), min_size=1, max_size=6),
    base=bases,
    spread=spreads,
    picks=st.lists(st.integers(0, K - 1), min_size=6, max_size=6),
)
def test_arrays_and_lists_agree(rows: list[list[float]], base: float, spread: float, picks: list[int]) -> None:
    tops = [_list(r, base, spread) for r in rows]
    chosen = [int(tops[i][picks[i]][0]) for i in range(len(tops))]
    arrays = TopLogprobs(
        np.array([[p[0] for p in t] for t in tops], dtype=np.int64),
        np.array([[p[1] for p in t] for t in tops], dtype=np.float64),
    )
    slow = [(b.position, b.chosen) for b in greedy_breaks("p", "free_run", tops, chosen)]
    fast = [(b.position, b.chosen) for b in greedy_breaks("p", "free_run", arrays, chosen)]
    assert fast == slow


def test_a_runner_up_1e30_behind_at_minus_3e38_is_not_greedy_on_either_path() -> None:
    top = [[9, -3.0e38], [5, -3.0e38 - 1e31]]
    arrays = TopLogprobs(np.array([[9, 5]], dtype=np.int64), np.array([[-3.0e38, -3.0e38 - 1e31]]))
    assert len(list(greedy_breaks("p", "free_run", [top], [5]))) == 1
    assert len(list(greedy_breaks("p", "free_run", arrays, [5]))) == 1
