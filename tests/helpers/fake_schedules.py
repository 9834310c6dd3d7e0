"""Fake engines for `gate invariance`'s negative controls: faults of the schedule a real
engine cannot be made to show on demand. Each is the toy model of tests/helpers/fake_engine.py with
schedule knobs declared (`schedule_knobs`, gate.core.engine).

- `KnobbedFake`: the honest toy model with the batch_size and threads knobs: batch- and
  order-invariant by construction, so every cell it runs is bit-identical.
- `PlaceFake`: logits that depend on a prompt's place in the batch: the runner-up's logit
  gains 0.5 nats per place, so a prompt anywhere but first in a batch flips where its
  leader was less than that far ahead.
- `JitterFake`: logits that move a little on every call: on every other generation of a
  prompt the runner-up's logit gains 0.3 nats.
- `ServerFake`: a toy server client with the concurrency knob: the runner hands it
  `concurrency` prompts per generate call (requests in flight); with `crowd=true` the
  runner-up's logit gains 0.5 nats whenever more than one request is in flight (a server
  whose batched kernels differ from its one-request ones).
- `BadKnobFake`: declares a knob outside gate's vocabulary (an engine error).
- `CacheFake`: the honest toy model with a prefix cache of whole `block`-token blocks
  (`prefix_cache`, `cache_block` knobs): a prompt it has served before takes its whole
  blocks short of the last token from the cache, counted as vLLM counts them
  (`prefix_reuse`); `SilentCacheFake` is the same engine that does not report its reuse, and
  `UncountedCacheFake` the same with `prefix_reuse` answering None (a server that does not say).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from gate.core.engine import PromptInput
from gate.core.traces.trace import PromptRecord
from helpers.fake_engine import FakeEngine


class KnobbedFake(FakeEngine):
    schedule_knobs: ClassVar[Mapping[str, str]] = {"batch_size": "batch_size", "threads": "threads"}

    def __init__(self, model: str, **options: Any) -> None:
        # The toy model has no threads; the knob is accepted and changes nothing.
        given = dict(options)
        self.threads = options.pop("threads", None)
        super().__init__(model, **options)
        FakeEngine.history[-1] = ("load", (model, given))  # as asked, threads included


class PlaceFake(KnobbedFake):
    PER_PLACE = 0.5

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        out: list[PromptRecord] = []
        for place, p in enumerate(prompts):
            self.opts["second_bias"] = self.PER_PLACE * place
            out.extend(super().generate([p], top_k))
        self.opts["second_bias"] = 0.0
        return out


class JitterFake(KnobbedFake):
    SHIFT = 0.3

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        out: list[PromptRecord] = []
        for p in prompts:
            self.opts["second_bias"] = self.SHIFT if self.generated.get(p.id, 0) % 2 else 0.0
            out.extend(super().generate([p], top_k))
        self.opts["second_bias"] = 0.0
        return out


class ServerFake(FakeEngine):
    schedule_knobs: ClassVar[Mapping[str, str]] = {"concurrency": "concurrency"}
    CROWD_BIAS = 0.5

    def __init__(self, model: str, **options: Any) -> None:
        given = dict(options)
        self.concurrency = int(options.pop("concurrency", 4))
        self.crowd = options.pop("crowd", "false") == "true"
        super().__init__(model, **options)
        FakeEngine.history[-1] = ("load", (model, given))

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        self.opts["second_bias"] = self.CROWD_BIAS if self.crowd and len(prompts) > 1 else 0.0
        out: list[PromptRecord] = []
        try:
            for p in prompts:
                out.extend(super().generate([p], top_k))
            return out
        finally:
            self.opts["second_bias"] = 0.0


class BadKnobFake(FakeEngine):
    schedule_knobs: ClassVar[Mapping[str, str]] = {"warp_speed": "seed"}


class SilentCacheFake(FakeEngine):
    schedule_knobs: ClassVar[Mapping[str, str]] = {"prefix_cache": "prefix_cache", "cache_block": "block"}

    def __init__(self, model: str, **options: Any) -> None:
        given = dict(options)
        self.cache_on = options.pop("prefix_cache", "0") == "1"
        self.block = int(options.pop("block", "64"))
        self.reused = (0, 0)
        self.seen: set[tuple[int, ...]] = set()
        super().__init__(model, **options)
        FakeEngine.history[-1] = ("load", (model, given))

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        for p in prompts:
            ids = tuple(p.prompt_token_ids)
            cached = (len(ids) - 1) // self.block * self.block if self.cache_on and ids in self.seen else 0
            if cached:
                self.reused = (self.reused[0] + 1, self.reused[1] + cached)
            self.seen.add(ids)
        return super().generate(prompts, top_k)


class CacheFake(SilentCacheFake):
    def prefix_reuse(self) -> tuple[int, int]:
        return self.reused


class UncountedCacheFake(SilentCacheFake):
    def prefix_reuse(self) -> tuple[int, int] | None:
        return None
