"""Sharded suites: split a suite over N machines by prompt id, and merge the traces back.

`gate run --shard K/N` runs the prompts with `shard_of(id, N) == K`. The assignment hashes
the id with SHA-256 (never Python's `hash`, which is salted per process), so every machine,
Python version and platform agrees on it, and a prompt's shard does not depend on the other
prompts of the suite. It does depend on N: the shards of one suite must share it.

`merge_traces` puts shard traces back together for one adjudication, and refuses to do so
when the result would not be one engine's run of one suite: a prompt in two shards, a
prompt of the suite in none, or shards whose provenance differs.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gate.core.storage.files import portable, portable_path
from gate.core.traces.trace import PromptRecord, Trace, TraceHeader
from gate.errors import InputError

# Header keys that differ between honest shards of one run and are not compared: when
# and where each ran. Everything else (model, top_k, engine name, version and options,
# dtype, revision, weight and tokenizer hashes, versions, sampling, suite hashes) must
# be identical, so a merged trace is one configuration's run.
VARYING_HEADER_KEYS = frozenset({"created_at", "shard", "host", "hostname", "merged_from"})
VARYING_ENGINE_KEYS = frozenset({"host", "hostname", "pid", "created_at"})
# Inside the header's `platform` object only the OS release string may differ (kernel
# patch levels of identical hosts); the system and the machine's architecture may not.
VARYING_PLATFORM_KEYS = frozenset({"platform", "release", "node"})
# How many ids an error lists before it says "and N more".
_SHOWN = 5

_SHARD_RE = re.compile(r"\s*(\d{1,30})\s*/\s*(\d{1,30})\s*")
# More shards than any suite has prompts to spread: a label past this is a corrupt or
# hostile header (a merge lists the missing shards, and must not try 10**12 of them).
MAX_SHARDS = 10_000


def _check_kn(k: int, n: int, what: str) -> None:
    if n < 1:
        raise InputError(f"{what}: N must be at least 1, found {n}")
    if n > MAX_SHARDS:
        raise InputError(f"{what}: N must be at most {MAX_SHARDS}, found {n}")
    if not 1 <= k <= n:
        raise InputError(f"{what}: K must be between 1 and N={n} (shards are numbered from 1), found {k}")


def parse_shard(text: str, *, option: str = "--shard") -> tuple[int, int]:
    """`"K/N"` to `(K, N)` with 1 <= K <= N; anything else is an InputError naming the option."""
    what = f"{option} {text!r}"
    m = _SHARD_RE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise InputError(f"{what}: expected K/N, e.g. 2/4 for the second of four shards")
    k, n = int(m.group(1)), int(m.group(2))
    _check_kn(k, n, what)
    return k, n


def format_shard(k: int, n: int) -> str:
    return f"{k}/{n}"


def shard_of(prompt_id: str, n: int) -> int:
    """The shard (1-based, 1..n) that prompt `prompt_id` belongs to among `n` shards."""
    if n < 1:
        raise InputError(f"shard count must be at least 1, found {n}")
    digest = hashlib.sha256(prompt_id.encode("utf-8", "surrogatepass")).digest()
    # 64 bits of the digest: the modulo bias is below 2**-40 for any sensible n.
    return int.from_bytes(digest[:8], "big") % n + 1


def select_shard(ids: Iterable[str], k: int, n: int) -> list[str]:
    """The ids of shard `k` of `n` (1-based), in their given order."""
    _check_kn(k, n, f"shard {k}/{n}")
    return [i for i in ids if shard_of(i, n) == k]


# --------------------------------------------------------------------------- merging


def _provenance(header: TraceHeader) -> dict[str, Any]:
    """The header flattened to the keys shards must agree on."""
    out: dict[str, Any] = {"role": header.role, "model": header.model, "top_k": header.top_k}
    for key, value in header.engine.items():
        if key not in VARYING_ENGINE_KEYS:
            out[f"engine.{key}"] = value
    for key, value in header.extra.items():
        if key == "platform" and isinstance(value, Mapping):
            value = {k: v for k, v in value.items() if k not in VARYING_PLATFORM_KEYS}
        if key not in VARYING_HEADER_KEYS:
            out[key] = value
    return out


def _shard_label(header: TraceHeader, path: str) -> tuple[int, int] | None:
    """The `shard` a trace's header says it holds ("K/N"), or None when it says nothing."""
    raw = header.extra.get("shard")
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise InputError(f"{path}: header field 'shard': expected a string K/N, found {raw!r}")
    return parse_shard(raw, option=f"{path}: header field 'shard'")


def _listing(ids: Sequence[str]) -> str:
    shown = ", ".join(repr(i) for i in ids[:_SHOWN])
    more = f" and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else ""
    return shown + more


def check_provenance(traces: Sequence[Trace]) -> None:
    """Every trace has the first one's provenance (ignoring when and where each ran)."""
    first = traces[0]
    ref = _provenance(first.header)
    for other in traces[1:]:
        theirs = _provenance(other.header)
        for key in sorted(ref.keys() | theirs.keys()):
            a, b = ref.get(key), theirs.get(key)
            if a != b or type(a) is not type(b):
                raise InputError(
                    f"{other.path}: header field '{key}' is {b!r}, but {first.path} has {a!r}: "
                    "shards of one run must share their provenance (same role, model, top_k, engine, "
                    "options and weights); rerun the odd shard with the others' configuration"
                )


def _check_shard_labels(traces: Sequence[Trace], *, complete: bool) -> None:
    """Where headers say which shard they hold: one N, no K twice, ids in their shard, no K missing."""
    labels = [(t, _shard_label(t.header, t.path)) for t in traces]
    labelled = [(t, kn) for t, kn in labels if kn is not None]
    if not labelled:
        return
    if len(labelled) != len(labels):
        bare = next(t for t, kn in labels if kn is None)
        raise InputError(f"{bare.path}: header has no 'shard' field, but other shard traces do")
    ns = {kn[1] for _, kn in labelled}
    if len(ns) > 1:
        raise InputError(f"shard traces split the suite different ways: N is {sorted(ns)} (one N per run)")
    seen: dict[int, str] = {}
    for t, (k, n) in labelled:
        if k in seen:
            raise InputError(f"{t.path}: shard {k}/{n} again (also {seen[k]})")
        seen[k] = t.path
        wrong = [r.id for r in t.records if shard_of(r.id, n) != k]
        if wrong:
            raise InputError(
                f"{t.path}: holds prompt(s) {_listing(wrong)} that belong to other shards than {k}/{n}: "
                "not a trace of this shard"
            )
    n = ns.pop()
    missing = [k for k in range(1, n + 1) if k not in seen]
    if complete and missing:
        raise InputError(f"shard(s) {', '.join(f'{k}/{n}' for k in missing)} missing: a merge needs all {n} shards")


def merge_traces(
    traces: Sequence[Trace],
    expected_ids: Sequence[str] | None = None,
    *,
    expected_from: str = "the suite",
) -> Trace:
    """One trace holding every record of `traces`, for one adjudication.

    Refuses (InputError, exit 2): no traces; shards whose provenance differs; a prompt id
    in two shards; shard labels in the headers that disagree. With `expected_ids` (the
    pin's suite, an oracle's ids; `expected_from` names it in messages): a missing or an
    extra id, and the records come out in its order. Without it, they keep the order of
    `traces`, and headers that carry `shard: "K/N"` must together cover 1..N.
    """
    if not traces:
        raise InputError("no shard traces to merge")
    check_provenance(traces)
    _check_shard_labels(traces, complete=expected_ids is None)
    found: dict[str, tuple[PromptRecord, str]] = {}
    for t in traces:
        for rec in t.records:
            if rec.id in found:
                raise InputError(f"{t.path}: prompt {rec.id!r} is also in {found[rec.id][1]}: shards must not overlap")
            found[rec.id] = (rec, t.path)
    if expected_ids is None:
        records = tuple(rec for rec, _ in found.values())
    else:
        expected = list(dict.fromkeys(expected_ids))
        missing = [i for i in expected if i not in found]
        if missing:
            raise InputError(
                f"{len(missing)} prompt(s) of {expected_from} are in no shard: {_listing(missing)} "
                "(a shard is missing, or did not finish; `gate run --resume` completes one)"
            )
        wanted = set(expected)
        extra = [i for i in found if i not in wanted]
        if extra:
            raise InputError(f"{len(extra)} prompt(s) in the shards are not in {expected_from}: {_listing(extra)}")
        records = tuple(found[i][0] for i in expected)
    return Trace(header=_merged_header(traces), records=records, path="<merged>")


def _merged_header(traces: Sequence[Trace]) -> TraceHeader:
    first = traces[0].header
    extra = {k: v for k, v in first.extra.items() if k != "shard"}
    extra["merged_from"] = [_origin(t) for t in traces]
    # The header gate writes names no folder of this machine (`gate.core.storage.files.portable`).
    return TraceHeader(
        role=first.role, model=first.model, top_k=first.top_k, engine=portable(first.engine), extra=portable(extra)
    )


def _origin(trace: Trace) -> Mapping[str, Any]:
    out: dict[str, Any] = {"path": portable_path(trace.path), "prompts": len(trace.records)}
    for key in ("shard", "created_at", "host", "hostname"):
        if key in trace.header.extra:
            out[key] = trace.header.extra[key]
    return out
