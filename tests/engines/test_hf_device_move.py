"""The HF engine moves a loaded model to its device only when some tensor of it is elsewhere:
a model transformers already built on the device (every CPU load, and gate diagnose's honest
engine on the candidate's lent weights) is taken as it is, without a walk of every module
through `Module.to`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gate.engines.hf.loading import on_device, to_device


class Recording(torch.nn.Module):
    """A module whose `to` is recorded (and does nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(2, 2))
        self.moves: list[Any] = []

    def to(self, *args: Any, **kwargs: Any) -> Recording:  # type: ignore[override]
        self.moves.append(args)
        return self


def test_a_module_on_its_device_is_not_moved() -> None:
    m = Recording()
    assert on_device(m, torch.device("cpu"))
    assert to_device(m, torch.device("cpu")) is m
    assert m.moves == []


@pytest.mark.parametrize("where", ["parameter", "buffer"])
def test_a_module_with_any_tensor_elsewhere_is_moved(where: str) -> None:
    m = Recording()
    if where == "parameter":
        m.other = torch.nn.Parameter(torch.zeros(1, device="meta"))
    else:
        m.register_buffer("table", torch.zeros(1, device="meta"), persistent=False)
    assert not on_device(m, torch.device("cpu"))
    assert to_device(m, torch.device("cpu")) is m
    assert m.moves == [(torch.device("cpu"),)]


def test_a_device_without_an_index_is_not_taken_for_its_first() -> None:
    # torch.device("cuda") != torch.device("cuda:0"): such a model is handed to `to`, as before.
    m = Recording()
    assert not on_device(m, torch.device("cuda"))
    assert not on_device(m, torch.device("cuda:0"))


@pytest.mark.slow
def test_the_engine_takes_a_model_loaded_on_its_device_as_it_is(llama_path: Path, monkeypatch: Any) -> None:
    from transformers import PreTrainedModel

    from gate.engines.hf.engine import HFEngine

    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a model already on the engine's device was moved")

    monkeypatch.setattr(PreTrainedModel, "to", refuse)
    engine = HFEngine(str(llama_path), tokenizer=False)
    assert all(p.device.type == "cpu" for p in engine.model.parameters())
    assert not engine.model.training
