"""Golden moves: which goldens a re-run moved, and why, judged against the oracle pin.

For every prompt whose tokens moved, the first moved position is judged where the golden
still shares the oracle's context: a tie-break, a near-tie flip or a real change (see
`gate.core.goldens.golden`). `GoldensResult` is what `gate goldens check` reports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gate.core.traces.machine import machine_key, same_machine
from gate.core.traces.trace import PromptRecord, Trace
from gate.core.verdict.chain import classify, position_evidence
from gate.core.verdict.doctrine import DEFAULT_DTYPE, Doctrine
from gate.core.verdict.evidence import RunDrift, own_margin
from gate.core.verdict.result import EXACT_TIE, NEAR_TIE
from gate.errors import InputError
from gate.text import plural

GOLDEN_VERSION = 1

# The causes of a move, and how reports name them.
TIE_BREAK = "tie_break"
NEAR_TIE_FLIP = "near_tie_flip"
REAL_CHANGE = "real_change"
CAUSE_LABELS = {
    TIE_BREAK: "was recording a tie-break",
    NEAR_TIE_FLIP: "near-tie flip",
    REAL_CHANGE: "real change",
}

_MATCH = "match"
_RATIFIED = frozenset({_MATCH, EXACT_TIE, NEAR_TIE})


@dataclass(frozen=True, slots=True)
class GoldenMove:
    """One prompt whose tokens moved: where first, from what to what, and why."""

    prompt_id: str
    position: int
    old_token: int | None  # the golden's token there; None: the golden ended before it
    new_token: int | None  # the new run's; None: the new run ended before it
    cause: str
    reason: str
    old_text: str | None = None
    new_text: str | None = None
    # The oracle's view of the position (None where it has none).
    shares_oracle_context: bool = False
    oracle_token: int | None = None
    oracle_text: str | None = None
    oracle_logprob: float | None = None
    old_logprob: float | None = None
    new_logprob: float | None = None
    gap_mnats: float | None = None  # oracle logprob of the old token minus the new's
    old_class: str | None = None  # "match", "exact_tie", "near_tie", "defect" against the oracle
    new_class: str | None = None
    tie_break: str | None = None  # exact ties: "lower_id" when the new token's id is lower
    # The new run's own logprob of its token minus that of the old token (its top-k, if any).
    candidate_gap_mnats: float | None = None
    moved_positions: int = 0  # positions whose token differs, this one and all downstream
    golden_length: int = 0
    candidate_length: int = 0
    prompt: str | None = None

    @property
    def label(self) -> str:
        return CAUSE_LABELS[self.cause]

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_id": self.prompt_id,
            "position": self.position,
            "old_token": self.old_token,
            "new_token": self.new_token,
            "old_text": self.old_text,
            "new_text": self.new_text,
            "cause": self.cause,
            "label": self.label,
            "reason": self.reason,
            "shares_oracle_context": self.shares_oracle_context,
            "oracle_token": self.oracle_token,
            "oracle_text": self.oracle_text,
            "oracle_logprob": self.oracle_logprob,
            "old_logprob": self.old_logprob,
            "new_logprob": self.new_logprob,
            "gap_mnats": self.gap_mnats,
            "old_class": self.old_class,
            "new_class": self.new_class,
            "tie_break": self.tie_break,
            "candidate_gap_mnats": self.candidate_gap_mnats,
            "moved_positions": self.moved_positions,
            "golden_length": self.golden_length,
            "candidate_length": self.candidate_length,
        }


def _text(rec: PromptRecord | None, i: int) -> str | None:
    if rec is None or rec.tokens is None or i >= len(rec.tokens):
        return None
    return rec.tokens[i]


def _at(ids: Sequence[int], i: int) -> int | None:
    return ids[i] if i < len(ids) else None


def first_move(old: Sequence[int], new: Sequence[int]) -> int | None:
    """The first position where two token sequences differ (one ending counts), or None."""
    if tuple(old) == tuple(new):
        return None
    n = min(len(old), len(new))
    return next((i for i in range(n) if old[i] != new[i]), n)


def _token_name(token: int, text: str | None) -> str:
    return f"{token} {text!r}" if text is not None else str(token)


def judge_move(
    golden: PromptRecord,
    candidate: PromptRecord,
    oracle: PromptRecord | None,
    doctrine: Doctrine,
    position: int,
    *,
    other_machine: bool = False,
    drift: RunDrift | None = None,
) -> GoldenMove:
    """Judge the first moved position of one prompt against the oracle's record.

    On another machine (`other_machine`) with the evidence doctrine, a move the oracle has
    no evidence on (the golden had left its path, or a token is outside its top-k) is
    judged by the new run's own logprobs: within the doctrine's candidate margin it is a
    near-tie flip of this machine's numbers, not a real change."""
    g, c = golden.token_ids, candidate.token_ids
    old, new = _at(g, position), _at(c, position)
    span = max(len(g), len(c))
    moved = sum(1 for i in range(position, span) if _at(g, i) != _at(c, i))
    base = GoldenMove(
        prompt_id=golden.id,
        position=position,
        old_token=old,
        new_token=new,
        cause=REAL_CHANGE,
        reason="",
        old_text=_text(golden, position),
        new_text=_text(candidate, position),
        candidate_gap_mnats=_own_gap(candidate, position, old, new),
        moved_positions=moved,
        golden_length=len(g),
        candidate_length=len(c),
        prompt=golden.prompt if golden.prompt is not None else candidate.prompt,
    )

    def real(reason: str, **kw: Any) -> GoldenMove:
        own = _own_near_tie(candidate, position, old, new, doctrine, drift) if other_machine else None
        if own is not None:
            return replace(base, cause=NEAR_TIE_FLIP, reason=f"{reason}; {own}", **kw)
        return _noted(replace(base, cause=REAL_CHANGE, reason=reason, **kw))

    if oracle is None:
        return real("no oracle evidence: the pin has no record of this prompt")
    o = oracle.token_ids
    left = next((i for i in range(position) if i >= len(o) or g[i] != o[i]), None)
    if left is not None:
        was = "ended" if left >= len(o) else f"took {o[left]}"
        return real(
            f"no oracle evidence: the golden left the oracle's path at position {left} "
            f"(golden {g[left]}, oracle {was}), so the oracle never saw this context"
        )
    top_lists = oracle.top_logprobs
    if position >= len(o) or top_lists is None:
        return real(f"no oracle evidence: the oracle's continuation ends at position {len(o)}")
    ctx: dict[str, Any] = {
        "shares_oracle_context": True,
        "oracle_token": o[position],
        "oracle_text": _text(oracle, position),
    }
    if old is None or new is None:
        which = "golden" if old is None else "new run"
        return real(f"the {which} ended at position {position}, the other did not", **ctx)
    top = top_lists[position]
    lps = {int(t): float(lp) for t, lp in top}
    ctx["oracle_logprob"] = lps.get(o[position])
    old_lp, new_lp = lps.get(old), lps.get(new)
    ctx["old_logprob"], ctx["new_logprob"] = old_lp, new_lp
    old_cls = _class_against_oracle(oracle, position, old, doctrine)
    new_top = candidate.top_logprobs[position] if candidate.top_logprobs is not None else None
    new_cls = _class_against_oracle(oracle, position, new, doctrine, candidate_top=new_top, drift=drift)
    ctx["old_class"], ctx["new_class"] = old_cls, new_cls
    if old_lp is None or new_lp is None:
        outside = [
            _token_name(t, x) for t, lp, x in ((old, old_lp, base.old_text), (new, new_lp, base.new_text)) if lp is None
        ]
        return real(
            f"the oracle's top-{len(top)} at position {position} does not hold {' or '.join(outside)}: "
            f"no evidence of a tie",
            **ctx,
        )
    gap = 1000.0 * (old_lp - new_lp)
    ctx["gap_mnats"] = gap
    both_ratified = old_cls in _RATIFIED and new_cls in _RATIFIED
    if old_lp == new_lp:
        # torch.argmax (and vLLM's greedy sampler) takes the lowest id among equal maxima.
        tie_break = "lower_id" if new < old else "higher_id"
        if both_ratified:
            return replace(
                base,
                cause=TIE_BREAK,
                tie_break=tie_break,
                reason=(
                    f"the oracle holds {old} and {new} at an exact tie (logprob {old_lp!r} bit for bit); "
                    f"the golden took the {'higher' if new < old else 'lower'} id, the new run the "
                    f"{'lower' if new < old else 'higher'}"
                ),
                **ctx,
            )
        below = 1000.0 * (lps[o[position]] - old_lp)
        return real(
            f"the oracle holds {old} and {new} at an exact tie, but {_mnats(below)} mnats below its own choice "
            f"{o[position]}: both are defects against the oracle",
            tie_break=tie_break,
            **ctx,
        )
    if both_ratified:
        return _noted(
            replace(
                base,
                cause=NEAR_TIE_FLIP,
                reason=(
                    f"the oracle holds {old} and {new} {_mnats(abs(gap))} mnats apart, both within the doctrine's "
                    f"near-tie threshold of its choice {o[position]}"
                ),
                **ctx,
            )
        )
    worst = old if old_cls not in _RATIFIED else new
    below = 1000.0 * (lps[o[position]] - lps[worst])
    return real(
        f"the oracle rates {'the old' if worst == old else 'the new'} token {worst} {_mnats(below)} mnats below its "
        f"choice {o[position]}, beyond the doctrine's near-tie threshold",
        **ctx,
    )


def _noted(move: GoldenMove) -> GoldenMove:
    """A move the oracle does not call a tie-break, where the new run's own logprobs hold the
    old and new token at an exact tie: worth saying (the engine's own tie-break picked
    between them), though it is no evidence against the oracle."""
    if move.candidate_gap_mnats != 0.0:
        return move
    note = "; the new run's own logprobs hold both tokens at an exact tie (its own tie-break, not the oracle's)"
    return replace(move, reason=move.reason + note)


def _mnats(x: float) -> str:
    """A gap in a reason: short when that is exact (`250`, `93.75`), else every digit, so a
    gap of 125.00000476837158 never reads as the 125 threshold it is judged to exceed."""
    short = f"{x:.3f}".rstrip("0").rstrip(".")
    return short if float(short) == x else repr(x)


def _own_near_tie(
    candidate: PromptRecord, position: int, old: int | None, new: int | None, doctrine: Doctrine, drift: RunDrift | None
) -> str | None:
    """Why a move is a near tie by the new run's own evidence (`own_margin`), or None."""
    ev = doctrine.evidence
    margin = own_margin(candidate, position, old, new, doctrine.dtype or DEFAULT_DTYPE, ev, drift)
    if margin is None or ev is None:
        return None
    return (
        f"on this machine the new run holds {new} only {margin:.2f} grid steps above {old} (its own logprobs; "
        f"the doctrine allows {ev.candidate_ulps:g}): a near tie of this machine's numbers"
    )


def _class_against_oracle(
    oracle: PromptRecord,
    position: int,
    token: int | None,
    doctrine: Doctrine,
    *,
    candidate_top: Any = None,
    drift: RunDrift | None = None,
) -> str | None:
    """The oracle's own token is a "match"; any other gets the class of taking it there."""
    if token is None or oracle.top_logprobs is None:
        return None
    chosen = oracle.token_ids[position]
    if token == chosen:
        return _MATCH
    logits = oracle.token_logits
    top_logit = None
    if logits is not None and position < len(logits) and isinstance(logits[position], (int, float)):
        top_logit = float(logits[position])
    evidence = position_evidence(
        prompt_id=oracle.id,
        position=position,
        source="free_run",
        top=oracle.top_logprobs[position],
        oracle_token=chosen,
        candidate_token=token,
        doctrine=doctrine,
        top_logit=top_logit,
        candidate_top=candidate_top,
        drift=drift,
    )
    return classify(evidence, doctrine).cls


def _own_gap(candidate: PromptRecord, position: int, old: int | None, new: int | None) -> float | None:
    """The new run's own logprob of its token minus the old token's, from its top-k."""
    top = candidate.top_logprobs
    if top is None or old is None or new is None or position >= len(top):
        return None
    lps = {int(t): float(lp) for t, lp in top[position]}
    if old not in lps or new not in lps:
        return None
    return 1000.0 * (lps[new] - lps[old])


def find_moves(
    golden: Trace,
    candidate: Trace,
    oracle: Trace,
    doctrine: Doctrine,
    *,
    other_machine: bool = False,
    drift: RunDrift | None = None,
) -> tuple[GoldenMove, ...]:
    """Every prompt of the golden whose tokens moved in `candidate`, in the golden's order
    (`other_machine`, `drift`: see `judge_move`)."""
    cand = candidate.by_id()
    pinned = oracle.by_id()
    missing = [r.id for r in golden.records if r.id not in cand]
    if missing:
        raise InputError(f"{candidate.path}: no record for golden prompt(s) {missing[:5]}")
    moves = []
    for g in golden.records:
        c = cand[g.id]
        p = first_move(g.token_ids, c.token_ids)
        if p is not None:
            moves.append(judge_move(g, c, pinned.get(g.id), doctrine, p, other_machine=other_machine, drift=drift))
    return tuple(moves)


# --------------------------------------------------------------------------- the result


@dataclass(frozen=True, slots=True)
class GoldensResult:
    """What `gate goldens check` found; owns its exit code (0 nothing moved, 1 moved)."""

    model: str
    engine: str
    golden_path: str
    prompts: int
    positions: int
    moves: tuple[GoldenMove, ...]
    doctrine: Doctrine
    golden_engine: Mapping[str, Any] = field(default_factory=dict)
    candidate_engine: Mapping[str, Any] = field(default_factory=dict)
    # Engine options whose value differs: name -> (golden's, now).
    option_changes: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    pin: Mapping[str, Any] = field(default_factory=dict)
    golden_created_at: str | None = None
    # With --accept: the rewritten golden and the backup of the old one.
    accepted: str | None = None
    backup: str | None = None
    notes: tuple[str, ...] = ()
    # Where the golden was recorded and where it was checked (`gate.core.traces.machine`).
    golden_machine: Mapping[str, Any] = field(default_factory=dict)
    machine: Mapping[str, Any] = field(default_factory=dict)

    @property
    def moved(self) -> bool:
        return bool(self.moves)

    @property
    def other_machine(self) -> bool:
        """Checked on a machine whose key differs from the golden's (unknown: not other)."""
        return same_machine(self.golden_machine, self.machine) is False

    @property
    def ratified_elsewhere(self) -> bool:
        """Moved, on another machine, and every move is a tie-break or near-tie flip."""
        return bool(self.moves) and self.other_machine and all(m.cause != REAL_CHANGE for m in self.moves)

    @property
    def verdict(self) -> str:
        if not self.moves:
            return "unchanged"
        if self.accepted:
            return "accepted"
        return "moved_within_doctrine" if self.ratified_elsewhere else "moved"

    @property
    def exit_code(self) -> int:
        """0 unchanged or accepted; on another machine, 0 when every move is within the
        doctrine (honest numbers move across machines); on the same machine any move is 1."""
        if not self.moves or self.accepted or self.ratified_elsewhere:
            return 0
        return 1

    @property
    def counts(self) -> dict[str, int]:
        causes = [m.cause for m in self.moves]
        return {
            "prompts": self.prompts,
            "moved": len(self.moves),
            "unchanged": self.prompts - len(self.moves),
            "positions": self.positions,
            "moved_positions": sum(m.moved_positions for m in self.moves),
            "tie_breaks": causes.count(TIE_BREAK),
            "near_tie_flips": causes.count(NEAR_TIE_FLIP),
            "real_changes": causes.count(REAL_CHANGE),
        }

    @property
    def summary(self) -> str:
        return goldens_summary(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gate_goldens": GOLDEN_VERSION,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "summary": self.summary,
            "model": self.model,
            "engine": self.engine,
            "golden": self.golden_path,
            "golden_created_at": self.golden_created_at,
            "doctrine": self.doctrine.to_dict(),
            "counts": self.counts,
            "moves": [m.to_dict() for m in self.moves],
            "golden_engine": dict(self.golden_engine),
            "candidate_engine": dict(self.candidate_engine),
            "option_changes": {k: list(v) for k, v in self.option_changes.items()},
            "pin": dict(self.pin),
            "accepted": self.accepted,
            "backup": self.backup,
            "notes": list(self.notes),
            "golden_machine": dict(self.golden_machine),
            "machine": dict(self.machine),
            "machine_keys": {"golden": machine_key(self.golden_machine), "now": machine_key(self.machine)},
            "other_machine": self.other_machine,
        }


def goldens_summary(result: GoldensResult) -> str:
    """`3/41 goldens moved (3 were recording a tie-break, 0 near-tie flips, 0 real changes)`."""
    c = result.counts
    if not result.moves:
        return f"0/{c['prompts']} goldens moved: every prompt gives the golden's {c['positions']} tokens"
    tie = "was" if c["tie_breaks"] == 1 else "were"
    line = (
        f"{c['moved']}/{c['prompts']} goldens moved ({c['tie_breaks']} {tie} recording a tie-break, "
        f"{plural(c['near_tie_flips'], 'near-tie flip', 'near-tie flips')}, "
        f"{plural(c['real_changes'], 'real change', 'real changes')})"
    )
    if result.accepted:
        line += f"; accepted: {result.accepted} rewritten"
    elif result.ratified_elsewhere:
        line += (
            f"; moved on another machine (golden {machine_key(result.golden_machine)}, "
            f"now {machine_key(result.machine)}), within the doctrine"
        )
    elif result.other_machine:
        line += (
            f"; on another machine (golden {machine_key(result.golden_machine)}, now "
            f"{machine_key(result.machine)}), but not every move is within the doctrine"
        )
    return line
