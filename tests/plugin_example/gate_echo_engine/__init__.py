"""gate-echo-engine: a complete gate engine plugin that replays a candidate trace file.

An engine that cannot run inside gate (a device with no Python, a closed server) writes
its greedy outputs as a gate trace; this engine serves them back through the engine
contract, so `gate run --engine echo --engine-opt trace=FILE` gates them like any engine.

gate finds it by the entry point in pyproject.toml:

    [project.entry-points."gate.engines"]
    echo = "gate_echo_engine:EchoEngine"

and builds it as `EchoEngine(model, **options)` with the `--engine-opt` strings. It imports
only gate's two front doors: `gate.engine` (the plugin contract) and `gate` (the Python API,
here for the trace reader). It has no `force` method (`gate.engine.ForcesDecode` is an
optional capability): a replayed trace cannot be re-run on the oracle's tokens, so gate
counts the positions after each prompt's first divergence as unadjudicated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gate import read_trace
from gate.engine import InputError, PromptInput, PromptRecord, parse_options

__version__ = "0.1.0"

OPTIONS: dict[str, tuple[type, Any]] = {
    "trace": (str, None),  # the candidate trace to replay (required)
}


class EchoEngine:
    name = "echo"

    def __init__(self, model: str, /, **options: Any) -> None:
        opts = parse_options(self.name, options, OPTIONS)
        if not opts["trace"]:
            raise InputError("engine 'echo' needs --engine-opt trace=FILE (a candidate trace to replay)")
        self.trace = read_trace(opts["trace"], role="candidate")
        if self.trace.header.model != model:
            raise InputError(f"{self.trace.path}: the trace is for model {self.trace.header.model!r}, not {model!r}")
        self.model = model
        self._records = self.trace.by_id()

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": __version__,
            "trace": self.trace.path,
            "replayed_engine": dict(self.trace.header.engine),
        }

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        out = []
        for p in prompts:
            rec = self._records.get(p.id)
            if rec is None:
                raise InputError(f"{self.trace.path}: no record for prompt {p.id!r}")
            if rec.prompt_token_ids != p.prompt_token_ids:
                raise InputError(f"{self.trace.path}: prompt {p.id!r} has other prompt_token_ids than the pin")
            n = p.max_tokens
            top = rec.top_logprobs[:n] if rec.top_logprobs is not None and top_k > 0 else None
            stopped = len(rec.token_ids) < n or rec.finish_reason == "stop"
            out.append(
                PromptRecord(
                    id=p.id,
                    prompt_token_ids=p.prompt_token_ids,
                    token_ids=tuple(rec.token_ids[:n]),
                    top_logprobs=top,
                    finish_reason="stop" if stopped else "length",
                    prompt=p.prompt,
                )
            )
        return out

    def encode(
        self, text: str | None = None, messages: Sequence[Mapping[str, str]] | None = None
    ) -> tuple[int, ...] | None:
        return None  # the pinned token ids are used as they are

    def decode_tokens(self, ids: Sequence[int]) -> list[str] | None:
        return None

    def close(self) -> None:
        pass
