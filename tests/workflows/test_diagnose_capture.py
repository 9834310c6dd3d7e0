"""How `gate diagnose` finds an engine's capture: by the capability protocols of the plugin
contract (`gate.engine`), never by class name, and what it makes of a `capture_activations`
answer. No torch: the engines here are plain classes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from gate.core.diagnosis.capture import DECODE, PREFILL
from gate.engine import CapturesActivations
from gate.errors import EngineError, InputError
from gate.workflows.diagnose.core import (
    NAMED_KIND,
    PATHS_KIND,
    NamedActivations,
    Target,
    capture_kind,
    capture_target,
    capturer_for,
    check_capturable,
)

CONTEXT = (5, 6, 7, 8)


class Activations:
    name = "acts"

    def __init__(self, answer: Mapping[str, Any] | None = None) -> None:
        self.answer = answer
        self.asked: list[tuple[list[int], Any]] = []

    def capture_activations(
        self, context_token_ids: Sequence[int], names: Sequence[str] | None = None
    ) -> Mapping[str, np.ndarray]:
        self.asked.append((list(context_token_ids), names))
        if self.answer is not None:
            return self.answer
        n = len(context_token_ids)
        return {
            "model.embed_tokens": np.ones((n, 3)),
            "model.layers.0.input_layernorm": np.ones((n, 3)),
            "model.layers.0.self_attn": np.ones((n, 3)),
            "model.layers.0.mlp": np.ones((n, 3)),
            "model.layers.0": np.ones((n, 3)),
            "model.layers.1": np.ones((n, 3)),
            "model.norm": np.ones((n, 3)),
            "something.else": np.ones((n, 3)),
        }


class HFEngine:  # a built-in's class name, without its capability: not capturable
    name = "impostor"


class Paths:
    name = "paths"

    def capture_path(self, prompt_token_ids: Sequence[int], context_token_ids: Sequence[int], path: str) -> Any:
        return ("captured", tuple(context_token_ids), path)


def test_the_kind_comes_from_the_protocols_not_the_class_name() -> None:
    assert capture_kind(Activations) == capture_kind(Activations()) == NAMED_KIND
    assert isinstance(Activations(), CapturesActivations)
    assert capture_kind(Paths) == PATHS_KIND
    assert capture_kind(HFEngine) is None
    with pytest.raises(InputError, match="cannot capture engine 'impostor'"):
        check_capturable(HFEngine, "impostor")
    assert capturer_for(Paths())((5,), CONTEXT, DECODE) == ("captured", CONTEXT, DECODE)


def test_an_activations_engine_is_captured_on_the_prefill_path_by_name() -> None:
    engine = Activations()
    target = Target("p", 2, "given", DECODE, (5, 6), CONTEXT)
    moved, notes = capture_target(engine, target)
    assert moved.path == PREFILL and notes and "capture_activations" in notes[0]
    assert capture_target(Paths(), target) == (target, ())
    # One path for a plugin and a dump file: the engine's named arrays, fetched for the
    # reference's module names and checked by the one function (dump.named_capture).
    named = capturer_for(engine)
    assert isinstance(named, NamedActivations) and named.error is EngineError
    names = ["model.layers.0.mlp", "model.layers.1"]
    arrays = named.fetch(CONTEXT, names)
    assert engine.asked == [(list(CONTEXT), names)]
    assert set(arrays) >= set(names)
