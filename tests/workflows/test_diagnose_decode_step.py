"""The decode path a diagnosis captures: a prefill over the context before its last token,
then the one decode step the position's token comes from (a forward per oracle token costs
nearly a prefill each on an AMX CPU: docs/results/diagnose-cost.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from gate.core.diagnosis.capture import Capture
from gate.workflows.diagnose.core import Target, decode_prompt, diagnose

PROMPT = (1, 2, 3, 4)


def target(oracle: tuple[int, ...], path: str = "decode") -> Target:
    return Target("p", len(oracle), "given", path, PROMPT, PROMPT + oracle)


def test_the_decode_path_prefills_all_but_the_last_context_token() -> None:
    assert decode_prompt(target((9, 8, 7))) == (1, 2, 3, 4, 9, 8)
    assert decode_prompt(target((9,))) == PROMPT  # one oracle token: the prompt, then its step
    assert decode_prompt(target(())) == PROMPT  # position 0: its token comes from the prefill


@pytest.mark.parametrize("path", ["decode", "prefill"])
def test_every_engine_is_asked_for_that_decode_path_and_the_diagnosis_says_so(path: str) -> None:
    calls: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []

    def capturer(who: str) -> Any:
        def capture(p: Sequence[int], c: Sequence[int], pa: str) -> Capture:
            calls.append((who + " " + pa, tuple(p), tuple(c)))
            return Capture(pa, len(c), ())

        return capture

    t = target((9, 8, 7), path)
    d = diagnose(t, capturer("candidate"), capturer("reference"), capturer("honest"))
    context = (*PROMPT, 9, 8, 7)
    for who in ("candidate", "reference", "honest"):
        assert (who + " decode", (1, 2, 3, 4, 9, 8), context) in calls
        assert (who + " prefill", PROMPT, context) in calls
    assert len(calls) == 6
    assert any("a prefill over the 6 context tokens before the position's last one" in n for n in d.notes)
    position_zero = diagnose(target((), path), capturer("c"), capturer("r"), capturer("h"))
    assert not any("decode step" in n for n in position_zero.notes)


def test_every_decode_step_asks_each_engine_for_its_whole_decode_loop() -> None:
    """`--every-decode-step`: the prompt, then a step per context token, as the engine's own
    loop ran (a cache bug that shows only from a later step is then in the capture)."""
    calls: list[tuple[str, tuple[int, ...]]] = []

    def capturer(who: str) -> Any:
        def capture(p: Sequence[int], c: Sequence[int], pa: str) -> Capture:
            calls.append((who + " " + pa, tuple(p)))
            return Capture(pa, len(c), ())

        return capture

    assert decode_prompt(target((9, 8, 7)), every_step=True) == PROMPT
    d = diagnose(target((9, 8, 7)), capturer("c"), capturer("r"), capturer("h"), every_step=True)
    assert {p for who, p in calls if who.endswith("decode")} == {PROMPT}
    assert not any("decode step that reads it" in n for n in d.notes)
