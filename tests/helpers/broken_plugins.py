"""Plugins that break the engine contract in ways a third party's first draft does, loaded as
`module:Class` (`--engine helpers.broken_plugins:NoClose`). Each `generate` fails with the
plugin's own error, which gate must show, never hide behind a failure of its own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gate.engine import PromptInput, PromptRecord

OWN_ERROR = "the plugin's own bug: shapes (1, 7) and (7, 2) do not match"


class NoClose:
    """Every method of the contract but `close`."""

    name = "no-close"

    def __init__(self, model: str, /, **options: Any) -> None:
        self.model = model

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "version": "0"}

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        raise RuntimeError(OWN_ERROR)

    def encode(
        self, text: str | None = None, messages: Sequence[Mapping[str, str]] | None = None
    ) -> tuple[int, ...] | None:
        return None

    def decode_tokens(self, ids: Sequence[int]) -> list[str] | None:
        return None


class CloseFails(NoClose):
    """The whole contract, but `close` fails too (after `generate` did)."""

    name = "close-fails"

    def close(self) -> None:
        raise RuntimeError("close failed as well")
