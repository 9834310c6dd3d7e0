"""Engine faults the gate must never mistake for a pass.

An engine that raises, hangs, returns NaN logprobs, stops short without saying it
stopped, or names token ids outside its vocabulary is broken, not divergent: each is an
`EngineError` (exit 3) naming the engine, the prompt and the fault. `GuardedEngine`
wraps any engine so the runner's generate and force calls get these checks and a
watchdog, without the run knowing.

`--timeout S` bounds each engine call in seconds: one `generate` call (one prompt unless
the engine batches prompts, then one batch) or one forced decode. Python cannot stop a
thread, so a call that overruns is abandoned in a daemon thread (which never keeps the
process alive) and the engine is not closed: its state is unknown.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from gate.core.engine import Engine, ForcedDecode, ForcedDecodeUnavailable, ForcesDecode, PromptInput
from gate.core.traces.trace import PromptRecord
from gate.errors import EngineError

T = TypeVar("T")


class EngineTimeout(EngineError):
    """An engine call ran past `--timeout` (exit 3)."""


def call_with_timeout(fn: Callable[[], T], timeout: float | None, what: str) -> T:
    """`fn()`, or EngineTimeout after `timeout` seconds; exceptions (Ctrl-C included) pass through.

    The call runs in a daemon thread and the caller waits on it, so a Ctrl-C still reaches
    the caller while the engine works."""
    if timeout is None:
        return fn()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread as it is
            box["error"] = exc

    worker = threading.Thread(target=target, name=f"gate-engine-{what}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise EngineTimeout(f"{what} did not finish within --timeout {timeout:g}s: the engine hangs or is too slow")
    if "error" in box:
        raise box["error"]
    return box["value"]


def vocab_size_of(info: Mapping[str, Any], *others: Any) -> int | None:
    """The vocabulary size where the engine's info (or a pin's provenance) states one."""
    for value in (info.get("vocab_size"), *others):
        if type(value) is int and value > 0:
            return value
    return None


def check_records(name: str, batch: Sequence[PromptInput], out: Sequence[PromptRecord], vocab_size: int | None) -> None:
    """The faults the engine contract's shape check does not see."""
    for p, rec in zip(batch, out, strict=False):
        where = f"engine {name!r}: prompt {p.id!r}"
        n = len(rec.token_ids)
        if n < p.max_tokens and rec.finish_reason != "stop":
            raise EngineError(
                f"{where}: returned {n} of {p.max_tokens} tokens with finish_reason {rec.finish_reason!r}; "
                "a short answer must end with 'stop' (the engine lost tokens)"
            )
        _check_ids(where, "token_ids", rec.token_ids, vocab_size)
        if rec.top_logprobs is not None:
            for i, pos in enumerate(rec.top_logprobs):
                for tid, lp in pos:
                    if not math.isfinite(float(lp)):
                        raise EngineError(f"{where}: position {i}: logprob {float(lp)!r} for token {tid} (not finite)")
                    _check_ids(where, f"top_logprobs[{i}]", (int(tid),), vocab_size)


def _check_ids(where: str, field: str, ids: Sequence[int], vocab_size: int | None) -> None:
    for i, t in enumerate(ids):
        if int(t) < 0 or (vocab_size is not None and int(t) >= vocab_size):
            bound = f" of size {vocab_size}" if vocab_size is not None else ""
            raise EngineError(f"{where}: {field}[{i}] = {t} is outside the vocabulary{bound}")


class GuardedEngine:
    """An `Engine` whose generate and force calls run under the watchdog and the fault checks.

    Everything else (info, encode, decode_tokens, and attributes such as `batch_size`) is
    the wrapped engine's."""

    def __init__(self, engine: Engine, *, timeout: float | None = None, vocab_size: int | None = None) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError("timeout must be positive")
        self.engine = engine
        self.name: str = str(getattr(engine, "name", type(engine).__name__))
        self.timeout = timeout
        self.vocab_size = vocab_size
        self.hung = False

    def __getattr__(self, attr: str) -> Any:
        # Optional attributes of the wrapped engine (batch_size, concurrency, ...).
        return getattr(self.engine, attr)

    def info(self) -> dict[str, Any]:
        return self.engine.info()

    def encode(
        self, text: str | None = None, messages: Sequence[Mapping[str, str]] | None = None
    ) -> tuple[int, ...] | None:
        return self.engine.encode(text=text, messages=messages)

    def decode_tokens(self, ids: Sequence[int]) -> list[str] | None:
        return self.engine.decode_tokens(ids)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return call_with_timeout(fn, self.timeout, f"engine {self.name!r}: {what}")
        except EngineTimeout:
            self.hung = True
            raise

    def generate(self, prompts: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
        ids = ", ".join(p.id for p in prompts[:3]) + (", ..." if len(prompts) > 3 else "")
        out = self._call(f"generate ({ids})", lambda: self.engine.generate(prompts, top_k))
        check_records(self.name, prompts, out, self.vocab_size)
        return out

    def force(self, prompt_token_ids: Sequence[int], token_ids: Sequence[int], top_k: int) -> ForcedDecode:
        engine = self.engine
        if not isinstance(engine, ForcesDecode):
            raise ForcedDecodeUnavailable(f"engine {self.name!r} has no forced decode (no `force` method)")
        fd = self._call("force", lambda: engine.force(prompt_token_ids, token_ids, top_k))
        _check_ids(f"engine {self.name!r}: force", "token_ids", fd.token_ids, self.vocab_size)
        return fd

    def close(self) -> None:
        # A hung call still holds the engine; closing it could hang as well.
        if not self.hung:
            self.engine.close()
