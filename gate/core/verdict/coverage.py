"""Where the candidate saw the oracle's context, and whether it reported a full list there.

The distribution verdict compares the candidate's top-k lists with the oracle's at every
position where both saw the same context:

- its free run, from position 0 up to and including its first divergence (every position
  of a prompt whose free run matches), wherever it has a token there;
- every position of a prompt it was teacher-forced through (`forced_token_ids`): its
  forced lists (`forced_top_logprobs`).

The pin's honest floor was measured with a list of the pin's `top_k` entries at every one of
those positions and at every oracle position (`gate run` forces every prompt that diverged).
A candidate that reports less (no list, an empty or a shorter one, a header `top_k` below
the pin's, positions after a divergence with no forced data) has not been measured the way
the floor was: its figures cannot be compared with the floor, and a pin with a floor does not
pass it (`Coverage.complete` False). A list needs min(the pin's top_k, the oracle's list at
that position) entries: an oracle list shorter than top_k is the oracle saying that no other
token has any mass, so the candidate cannot be asked for more.

Pure: no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from gate.core.traces.trace import PromptRecord
from gate.core.verdict.own_lists import FORCED, FREE_RUN, OwnLists
from gate.text import plural

# How many prompts lacking lists a report names (all are counted).
PROMPTS_NAMED = 5


def first_divergence(oracle: PromptRecord, candidate: PromptRecord) -> int | None:
    """The free run's first divergence (a position where the candidate differs or has run out)."""
    ot, ct = oracle.token_ids, candidate.token_ids
    n = len(ot)
    if ct[:n] == ot:
        return None
    return next((i for i in range(n) if i >= len(ct) or ct[i] != ot[i]), None)


def free_context(oracle: PromptRecord, candidate: PromptRecord) -> range:
    """The free-run positions that share the oracle's context and where the candidate has a token."""
    n = len(oracle.token_ids)
    first = first_divergence(oracle, candidate)
    end = n if first is None else first + 1
    return range(min(end, len(candidate.token_ids), n))


def needed(oracle_top: Sequence[Sequence[Any]], top_k: int) -> int:
    """How many entries a candidate's list needs at a position (see the module doc)."""
    return max(1, min(top_k, len(oracle_top)))


def context_lists(
    oracle: PromptRecord, candidate: PromptRecord, own: OwnLists
) -> Iterator[tuple[int, str, Sequence[Sequence[Any]] | None]]:
    """(position, FREE_RUN or FORCED, the candidate's list there or None) at every position
    where the candidate saw the oracle's context: its free-run prefix, then every forced one."""
    for i in free_context(oracle, candidate):
        yield i, FREE_RUN, own.at(FREE_RUN, i)
    if candidate.forced_token_ids is not None:
        for i in range(len(oracle.token_ids)):
            yield i, FORCED, own.at(FORCED, i)


@dataclass(frozen=True, slots=True)
class Coverage:
    """What the candidate reported at the positions the floor was measured at.

    required: the lists needed (free-run context positions plus forced positions);
    missing: of those, how many are absent or empty; short: how many hold fewer entries
    than needed; uncovered: oracle positions on no context the candidate shares (after a
    free-run divergence, in a prompt without forced data); candidate_top_k / pin_top_k: the
    headers' `top_k`; prompts: the prompts lacking something (the first few), of
    prompts_lacking in all."""

    required: int = 0
    missing: int = 0
    short: int = 0
    uncovered: int = 0
    candidate_top_k: int = 0
    pin_top_k: int = 0
    prompts: tuple[str, ...] = ()
    prompts_lacking: int = 0

    @property
    def complete(self) -> bool:
        return (
            not self.missing
            and not self.short
            and not self.uncovered
            and self.candidate_top_k >= self.pin_top_k
            and self.required > 0
        )

    def reason(self) -> str | None:
        """What is missing, in words (None: nothing)."""
        if self.complete:
            return None
        parts: list[str] = []
        if self.candidate_top_k < self.pin_top_k:
            parts.append(f"the candidate's header top_k {self.candidate_top_k} is below the pin's {self.pin_top_k}")
        if self.required == 0:
            parts.append("no position carries the candidate's top-k")
        if self.missing:
            parts.append(f"{self.missing} of the {self.required} top-k lists needed absent or empty")
        if self.short:
            parts.append(f"{plural(self.short, 'list')} shorter than the pin's top_k {self.pin_top_k}")
        if self.uncovered:
            parts.append(
                f"{plural(self.uncovered, 'oracle position')} after a free-run divergence with no forced "
                "data (forced_token_ids and forced_top_logprobs)"
            )
        if self.prompts:
            more = (
                f" and {self.prompts_lacking - len(self.prompts)} more"
                if self.prompts_lacking > len(self.prompts)
                else ""
            )
            parts.append(f"in prompts {', '.join(repr(p) for p in self.prompts)}{more}")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "complete": self.complete,
            "required_lists": self.required,
            "missing_lists": self.missing,
            "short_lists": self.short,
            "uncovered_positions": self.uncovered,
            "candidate_top_k": self.candidate_top_k,
            "pin_top_k": self.pin_top_k,
            "prompts_lacking": self.prompts_lacking,
            "prompts_named": list(self.prompts),
            "reason": self.reason(),
        }


def prompt_coverage(
    oracle: PromptRecord, candidate: PromptRecord, own: OwnLists, top_k: int
) -> tuple[int, int, int, int]:
    """(required, missing, short, uncovered) for one prompt (see `Coverage`)."""
    otop = oracle.top_logprobs or ()
    required = missing = short = 0
    for i, _, ctop in context_lists(oracle, candidate, own):
        required += 1
        if ctop is None or not len(ctop):
            missing += 1
        elif i < len(otop) and len(ctop) < needed(otop[i], top_k):
            short += 1
    uncovered = 0
    if candidate.forced_token_ids is None:
        uncovered = len(oracle.token_ids) - len(free_context(oracle, candidate))
    return required, missing, short, uncovered


def coverage_of(
    pairs: Sequence[tuple[PromptRecord, PromptRecord, OwnLists]], pin_top_k: int, candidate_top_k: int
) -> Coverage:
    """The coverage of a run (`pairs`: each oracle record, the candidate's, its own lists)."""
    total = [0, 0, 0, 0]
    lacking: list[str] = []
    for o, c, own in pairs:
        counts = prompt_coverage(o, c, own, pin_top_k)
        total = [a + b for a, b in zip(total, counts, strict=True)]
        if any(counts[1:]):
            lacking.append(o.id)
    return Coverage(
        required=total[0],
        missing=total[1],
        short=total[2],
        uncovered=total[3],
        candidate_top_k=candidate_top_k,
        pin_top_k=pin_top_k,
        prompts=tuple(lacking[:PROMPTS_NAMED]),
        prompts_lacking=len(lacking),
    )
