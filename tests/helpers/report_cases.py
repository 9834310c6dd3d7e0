"""The inputs whose reports must not move (pure: no engine, no torch): the spec's seed
example, every outcome of `trace_builders.mixed_records`, candidates made from the default
pin that each end in one rule of the chain, and generated traces under a distribution
floor. Each case is a `GateResult` built as `gate compare` builds it (or as `gate run`
judges it, for the generated ones); `tests/reports/test_reports_unchanged.py` renders each
in every format and compares with the committed files under `tests/reports/expected/`.

Every case is built inside the working folder it is given, from relative paths, so no
absolute path reaches a report."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gate.core.verdict.adjudicate import compare
from gate.core.verdict.result import GateResult
from gate.workflows.common.requests import DoctrineFlags
from gate.workflows.run.compare import CompareRequest, compare_traces
from helpers.free_forced_traces import floor_between, two_minded
from helpers.generated_traces import DOCTRINES, build
from helpers.pin_attacks import PIN, candidate, gap, oracle_dicts, own_step, raise_runner_up, resort, same, unit, write
from helpers.trace_builders import SEED_CANDIDATE, SEED_ORACLE, mixed_records, write_pair

Built = tuple[dict[str, Any], list[dict[str, Any]]]


def _compare(oracle: str, cand: str, *, no_evidence: bool = False, strict: bool = False) -> GateResult:
    request = CompareRequest(Path(oracle), Path(cand), DoctrineFlags(None, None, no_evidence), strict)
    return compare_traces(request)


# The pin's first prompts: every rule is reached in them, and the reports stay small.
PIN_PROMPTS = 8


def _pin_case(name: str, built: Built, **flags: bool) -> GateResult:
    """`built` against the pin's first `PIN_PROMPTS` prompts (a pin of its own, the pin's
    header and doctrine kept)."""
    if not Path("pin.jsonl").exists():
        lines = PIN.read_bytes().splitlines(keepends=True)
        Path("pin.jsonl").write_bytes(b"".join(lines[: 1 + PIN_PROMPTS]))
    path = f"{name}.jsonl"
    if not Path(path).exists():
        head, records = built
        write(Path(path), head, records[:PIN_PROMPTS])
    return _compare("pin.jsonl", path, **flags)


def _spots(lo: float, hi: float, step: Callable[[dict[str, Any], int], float] = unit) -> set[tuple[int, int]]:
    """The first six positions of the pin's first prompts beyond 125 mnats whose oracle gap
    is `lo` < gap <= `hi` in `step`s (the evidence unit, or the logit's own grid step)."""
    out: set[tuple[int, int]] = set()
    for p, rec in enumerate(oracle_dicts()[:PIN_PROMPTS]):
        for i in range(len(rec["token_ids"])):
            if gap(rec, i) > 0.125 and lo < gap(rec, i) / step(rec, i) <= hi and len(out) < 6:
                out.add((p, i))
    return out


def _runner_up_taken(
    spots: set[tuple[int, int]], margin: Callable[[dict[str, Any], int], float], *, empty: bool = False
) -> Built:
    """In the forced decode only, at `spots`, the candidate takes the oracle's runner-up, its
    own list holding it `margin(rec, i)` nats above the oracle's token (below it where
    negative), or (`empty`) no list there at all."""

    def own(p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> list[list[Any]]:
        if (p, i) not in spots:
            return [list(x) for x in top]
        (t0, lp0), (t1, _), *rest = top
        return [] if empty else resort([[t0, lp0 - margin(rec, i)], [t1, lp0], *rest])

    def choose(p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> int | None:
        return int(rec["top_logprobs"][i][1][0]) if (p, i) in spots else None

    return candidate(own, choose=choose, only_forced_flips=True)


def _clear(empty: bool = False) -> Built:
    """Flips within two steps of the logit's own grid, its own lists calling each a clear
    choice (5 evidence units), or giving no list there."""
    return _runner_up_taken(_spots(0.0, 2.0, own_step), lambda rec, i: 5 * unit(rec, i), empty=empty)


def _half_unit(rec: dict[str, Any], i: int) -> float:
    return 0.5 * unit(rec, i)


def _within_rounding(rec: dict[str, Any], i: int) -> float:
    """A negative margin inside one float32 rounding: greedy still, yet below the oracle's."""
    return -3e-8


def _penalised(p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> int | None:
    """A sampler with a penalty: the runner-up where the oracle's gap is 1-4 units."""
    return int(top[1][0]) if 1.0 < gap(rec, i) / unit(rec, i) <= 4.0 else None


def _late(p: int, rec: dict[str, Any], i: int, top: list[list[Any]]) -> list[list[Any]]:
    return raise_runner_up(3.0)(p, rec, i, top) if i >= 16 else [list(x) for x in top]


def _seed() -> GateResult:
    for src in (SEED_ORACLE, SEED_CANDIDATE):
        if not Path(src.name).exists():
            shutil.copyfile(src, src.name)
    return _compare(SEED_ORACLE.name, SEED_CANDIDATE.name)


def _mixed(**flags: bool) -> GateResult:
    if not Path("mixed-oracle.jsonl").exists():
        write_pair(Path("."), *mixed_records(), name="mixed")
    return _compare("mixed-oracle.jsonl", "mixed-candidate.jsonl", **flags)


def _generated(seed: int, noise: float, bias: float, doctrine: str) -> GateResult:
    oracle, cand = build(seed, noise, bias)
    return compare(oracle, cand, DOCTRINES[doctrine])


def _two_minded() -> GateResult:
    oracle, cand = two_minded()
    return compare(oracle, cand, floor_between(oracle, cand))


# name -> how to build it in the working folder.
CASES: dict[str, Callable[[], GateResult]] = {
    "seed": _seed,
    "mixed": _mixed,
    "mixed-strict": lambda: _mixed(strict=True),
    "pin-honest": lambda: _pin_case("honest", candidate(same)),
    "pin-own-margin": lambda: _pin_case("clear", _clear()),
    "pin-own-margin-no-evidence": lambda: _pin_case("clear", _clear(), no_evidence=True),
    "pin-no-list": lambda: _pin_case("empty", _clear(empty=True)),
    "pin-not-greedy": lambda: _pin_case("penalised", candidate(same, choose=_penalised, forced=False)),
    "pin-drift": lambda: _pin_case("late", candidate(_late)),
    "pin-drift-no-evidence": lambda: _pin_case("late", candidate(_late), no_evidence=True),
    "pin-evidence": lambda: _pin_case("raised", candidate(raise_runner_up(1.5))),
    "pin-oracle-gap": lambda: _pin_case("oracle-gap", _runner_up_taken(_spots(5.0, 9.0), _half_unit)),
    "pin-negative-margin": lambda: _pin_case("negative", _runner_up_taken(_spots(1.0, 3.0), _within_rounding)),
    "generated-floor-honest": lambda: _generated(7, 0.01, 0.0, "floor"),
    "generated-floor-biased": lambda: _generated(5, 0.3, 2.0, "floor"),
    "generated-evidence-floor": lambda: _generated(11, 0.8, 0.0, "evidence + floor"),
    "generated-evidence-loose-floor": lambda: _generated(202, 0.3, 0.0, "evidence + loose floor"),
    "two-minded": _two_minded,
}
