"""Calls into an engine, each checked: loading and closing, generate, the forced decode.

An engine's own failure (not a gate error) becomes an `EngineError` (exit 3) naming the
engine and the call; an engine that breaks the contract's shapes fails the same way,
never as bad input.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

from gate.core.engine import (
    BatchesPrompts,
    Engine,
    ForcedDecodeUnavailable,
    ForcesDecode,
    KeepsRequestsInFlight,
    PromptInput,
)
from gate.core.traces.moe import FORCED_ROUTED_EXPERTS, FORCED_ROUTER_TOP
from gate.core.traces.trace import EVIDENCE_KEYS, FORCED_MODES, PromptRecord, TopList, Trace
from gate.core.traces.validate import check_forced_top, check_top_logprobs
from gate.errors import EngineError, GateError, TraceError
from gate.workflows.common.guard import EngineTimeout
from gate.workflows.common.progress import QUIET, Progress

T = TypeVar("T")


def engine_name(engine: Engine | str) -> str:
    return engine if isinstance(engine, str) else str(getattr(engine, "name", type(engine).__name__))


def engine_call(engine: Engine | str, what: str, fn: Callable[[], T]) -> T:
    """Call into an engine; its own failure (not a gate error) is an EngineError, exit 3."""
    name = engine_name(engine)
    try:
        return fn()
    except GateError:
        raise
    except MemoryError as exc:
        raise EngineError(f"engine {name!r} ran out of memory in {what}: {exc}") from exc
    except Exception as exc:
        raise EngineError(f"engine {name!r} failed in {what}: {type(exc).__name__}: {exc}") from exc


@contextmanager
def open_engine(load: Callable[[], Engine], name: str) -> Iterator[Engine]:
    """The engine `load()` builds, closed when the block ends, unless a call timed out:
    the engine is then still busy in an abandoned thread, and closing it could hang too.
    When the block failed, that failure is what is reported: closing is still tried, and its
    own failure is not allowed to replace the first."""
    engine = engine_call(name, "load", load)
    try:
        yield engine
    except EngineTimeout:
        raise
    except BaseException:
        with suppress(Exception):
            engine_call(name, "close", lambda: engine.close())
        raise
    engine_call(name, "close", lambda: engine.close())


def batch_size_for(engine: Engine, prompts: int) -> int:
    """How many prompts go to one `generate` call: the engine's `batch_size` (0: all at
    once) or `concurrency` where it has one (`BatchesPrompts`, `KeepsRequestsInFlight`),
    else one at a time, which lets the progress bar move per prompt."""
    sizes = (
        engine.batch_size if isinstance(engine, BatchesPrompts) else None,
        engine.concurrency if isinstance(engine, KeepsRequestsInFlight) else None,
    )
    for value in sizes:
        if type(value) is int and value >= 0:
            return value if value > 0 else max(1, prompts)
    return 1


def plain_top(top: Sequence[TopList]) -> list[list[list[Any]]]:
    """Top-k lists as the trace reader sees them after a round trip through JSON."""
    return [[[int(t), float(lp)] for t, lp in pos] for pos in top]


def checked_records(engine: Engine, batch: Sequence[PromptInput], out: Sequence[PromptRecord]) -> list[PromptRecord]:
    """An engine that breaks the contract fails as the engine (exit 3), not as bad input."""
    name = engine_name(engine)
    if len(out) != len(batch):
        raise EngineError(f"engine {name!r}: generate returned {len(out)} records for {len(batch)} prompts")
    for p, rec in zip(batch, out, strict=True):
        if rec.id != p.id or tuple(rec.prompt_token_ids) != p.prompt_token_ids:
            raise EngineError(
                f"engine {name!r}: generate returned record {rec.id!r} for prompt {p.id!r} (or changed its prompt ids)"
            )
        if len(rec.token_ids) > p.max_tokens:
            raise EngineError(
                f"engine {name!r}: prompt {p.id!r}: {len(rec.token_ids)} tokens for max_tokens {p.max_tokens}"
            )
        if rec.top_logprobs is not None:
            try:
                check_top_logprobs(f"<engine {name}>", 0, plain_top(rec.top_logprobs), rec.token_ids, oracle=False)
            except TraceError as exc:
                raise EngineError(f"engine {name!r}: prompt {p.id!r}: invalid top logprobs: {exc.problem}") from None
    return list(out)


def generate(engine: Engine, batch: Sequence[PromptInput], top_k: int) -> list[PromptRecord]:
    """One checked `generate` call."""
    out = engine_call(engine, "generate", partial(engine.generate, batch, top_k))
    return checked_records(engine, batch, out)


def decode_tokens(engine: Engine, ids: Sequence[int]) -> list[str] | None:
    """The text of each of `ids`, or None when the engine has none (or gives the wrong count)."""
    texts = engine_call(engine, "decode_tokens", partial(engine.decode_tokens, list(ids)))
    return list(texts) if texts is not None and len(texts) == len(ids) else None


def late_info(engine: Engine) -> dict[str, Any]:
    """An engine's provenance that only its answers show (its optional `late_info()`,
    called after the free run: e.g. the model names an HTTP server answered as)."""
    late = getattr(engine, "late_info", None)
    if not callable(late):
        return {}
    out = engine_call(engine, "late_info", late)
    return dict(out) if isinstance(out, Mapping) else {}


def additions(rec: PromptRecord) -> dict[str, Any]:
    """A record's fields beyond v1's (its `extra` and the typed additions), for `replace`."""
    return {"extra": dict(rec.extra), **{key: getattr(rec, key) for key in EVIDENCE_KEYS}}


def diverged_ids(oracle: Trace, candidate: Trace) -> list[str]:
    """Ids of the prompts whose free run differs from the oracle's tokens."""
    cand = candidate.by_id()
    out = []
    for o in oracle.records:
        c = cand.get(o.id)
        if c is not None and tuple(c.token_ids[: len(o.token_ids)]) != tuple(o.token_ids):
            out.append(o.id)
    return out


def force_along(
    engine: Engine,
    oracle: Trace,
    free: Trace,
    *,
    top_k: int,
    known: Mapping[str, PromptRecord] | None = None,
    progress: Progress = QUIET,
    skip_unavailable: bool = False,
) -> tuple[Trace, tuple[str, ...]]:
    """`free` with `forced_token_ids` (and `forced_mode`) on every prompt whose free run
    left `oracle`'s tokens, and the ids of the prompts forced.

    Each forced position is then classified on its own, so a tie early in a prompt cannot
    hide a defect later in it. A forced decode depends only on the prompt and the tokens
    fed, so a record in `known` forced along the very same tokens is reused instead of
    decoded again. With `skip_unavailable`, a prompt the engine cannot force
    (`ForcedDecodeUnavailable`: a server without prompt logprobs, a text prompt whose
    tokens cannot be mapped back) is skipped: the positions after its first divergence are
    reported unadjudicated, and the other prompts are still forced.
    """
    name = engine_name(engine)
    ids = diverged_ids(oracle, free)
    progress.phase("force", len(ids))
    if not ids:
        return free, ()
    orc, cand = oracle.by_id(), free.by_id()
    forced: dict[str, PromptRecord] = {}
    for pid in ids:
        o, c = orc[pid], cand[pid]
        prior = (known or {}).get(pid)
        if prior is not None and prior.forced_token_ids is not None:
            forced[pid] = replace(c, forced_token_ids=prior.forced_token_ids, **additions(prior))
            progress.advance()
            continue
        try:
            if not isinstance(engine, ForcesDecode):
                raise ForcedDecodeUnavailable(f"engine {name!r} has no forced decode (no `force` method)")
            fd = engine_call(engine, "force", partial(engine.force, o.prompt_token_ids, o.token_ids, top_k))
        except ForcedDecodeUnavailable:
            if skip_unavailable:
                progress.advance()
                continue
            raise
        if len(fd.token_ids) != len(o.token_ids):
            raise EngineError(
                f"engine {name!r}: force returned {len(fd.token_ids)} choices for {len(o.token_ids)} oracle tokens "
                f"(prompt {pid!r})"
            )
        if fd.mode not in FORCED_MODES:
            raise EngineError(
                f"engine {name!r}: force returned mode {fd.mode!r} (prompt {pid!r}); expected decode or prefill"
            )
        forced_top: Sequence[TopList] | None = None
        if fd.top_logprobs is not None and len(fd.top_logprobs) == len(o.token_ids):
            # The candidate's own top-k at each forced position: the doctrine's evidence of
            # how close the candidate itself saw a flip, and of its drift (a trace addition).
            # Checked here, once, as the reader checks a trace's.
            try:
                forced_top = check_forced_top(
                    f"<engine {name}>", 0, plain_top(fd.top_logprobs), fd.token_ids, free.header, oracle=False
                )
            except TraceError as exc:
                raise EngineError(
                    f"engine {name!r}: prompt {pid!r}: invalid forced top logprobs: {exc.problem}"
                ) from None
        forced[pid] = replace(
            c,
            forced_token_ids=tuple(int(t) for t in fd.token_ids),
            forced_mode=fd.mode,
            # MoE: the candidate's routing on the oracle's tokens (docs/guides/moe-routing.md).
            forced_routed_experts=fd.extra.get(FORCED_ROUTED_EXPERTS),
            forced_router_top=fd.extra.get(FORCED_ROUTER_TOP),
            forced_top_logprobs=forced_top,
        )
        progress.advance()
    records = tuple(forced.get(r.id, r) for r in free.records)
    return replace(free, records=records), tuple(forced)
