"""What llama-server says its prompt cache served, read from the answers gate already gets.

Each `/completion` answer carries `timings.cache_n`: the prompt tokens the slot took from its
cache instead of evaluating them (llama-server 0.3.36's build: `cache_n + prompt_n` is the
prompt's length; the same prompt again gives its length less one, the last token being
evaluated again; `cache_prompt: false` gives 0). `tokens_cached` is not a count of reuse: it is
what the slot holds after the request (the prompt and the generated tokens), cached or not.

A count is taken only as a whole number from 0 to the prompt's length (JSON `true` is not one,
nor `2.0`); an answer without one, or with anything else, leaves the total unknown from then on
(`None`: the engine does not report), so a server that says nothing, or says something gate
cannot take, is never read as having served nothing, nor as having served what it claims.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any


def cache_n(answer: Mapping[str, Any], prompt_tokens: int) -> int | None:
    """The answer's `timings.cache_n` where it is a whole number of the prompt's tokens, else None."""
    timings = answer.get("timings")
    value = timings.get("cache_n") if isinstance(timings, dict) else None
    if type(value) is not int or not 0 <= value <= prompt_tokens:
        return None
    return value


class PromptCacheCount:
    """The engine's running total over every answer (requests from several threads at once):
    (answers with a cached prefix, prompt tokens taken from the cache), or None before the
    first answer and for good after one without a count it can take."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers = 0
        self._hits = 0
        self._tokens = 0
        self._uncounted = False

    def add(self, answer: Mapping[str, Any], prompt_tokens: int) -> None:
        cached = cache_n(answer, prompt_tokens)
        with self._lock:
            self._answers += 1
            if cached is None:
                self._uncounted = True
            elif cached > 0:
                self._hits += 1
                self._tokens += cached

    def total(self) -> tuple[int, int] | None:
        with self._lock:
            if self._uncounted or self._answers == 0:
                return None
            return self._hits, self._tokens
