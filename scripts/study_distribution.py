"""The doctrine study's distribution table (pure: reads traces, no torch).

For every recorded variant: the distribution figures against its pin at the positions where
both saw the oracle's context (`gate.core.verdict.distribution`), the floor these honest
variants measure (their maxima of mean and p99 KL, their minimum same-top rate), the
realistic candidates' minima, the margin between them, each variant's figures as multiples
of the committed pin's floor (`x pin floor`), the candidate's own free-run lists against its
forced ones where both saw one context (`gate.core.verdict.free_forced`), and each variant's
verdict under the committed pin's floor and under the pin's whole doctrine.

Used by `scripts/doctrine_study.py table`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Row:
    name: str
    kind: str
    result: Any  # GateResult under the pin's whole doctrine (evidence rule and floor)


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def measured_floor(rows: Sequence[Row], honest: str) -> tuple[float, float, float, str]:
    """(max mean KL, max p99 KL, min same-top rate, which variants) over the honest rows."""
    figs = [(r.name, r.result.distribution.overall) for r in rows if r.kind == honest]
    figs = [(n, f) for n, f in figs if f.positions]
    if not figs:
        return 0.0, 0.0, 1.0, "none"
    mean = max(figs, key=lambda x: x[1].kl_mean_mnats)
    p99 = max(figs, key=lambda x: x[1].kl_p99_mnats)
    same = min(figs, key=lambda x: x[1].same_top_rate)
    return (
        mean[1].kl_mean_mnats,
        p99[1].kl_p99_mnats,
        same[1].same_top_rate,
        f"mean KL {mean[0]}, p99 KL {p99[0]}, same top {same[0]}",
    )


def print_distribution_table(
    rows: Sequence[Row], *, honest: str, realistic: Sequence[str], say: Callable[[str], None]
) -> None:
    head = [
        "variant",
        "kind",
        "positions",
        "KL mean ± se",
        "KL median",
        "KL p99",
        "KL max",
        "same top %",
        "Δp rms %",
        "x floor (mean/p99/miss)",
        "x pin floor",
        "free vs forced KL mean/p99 (n)",
        "distribution",
        "verdict (pin doctrine + floor)",
    ]
    fl_mean, fl_p99, fl_same, which = measured_floor(rows, honest)
    table: list[list[str]] = []
    for r in rows:
        d = r.result.distribution
        f = d.overall
        ratio = "-"
        if f.positions and fl_mean > 0 and fl_p99 > 0:
            miss = (1 - f.same_top_rate) / (1 - fl_same) if fl_same < 1 else float("inf")
            ratio = f"{f.kl_mean_mnats / fl_mean:.2f}/{f.kl_p99_mnats / fl_p99:.2f}/{miss:.2f}"
        if d.floor is None:
            dist = "no floor"
        elif d.insufficient:
            dist = "NOT JUDGED"
        elif not d.judged:
            dist = "not judged"
        else:
            dist = "BEYOND" if d.beyond else "within"
        pinned = "-"
        if f.positions and d.floor is not None:
            fl = d.floor
            pin_miss = (1 - f.same_top_rate) / (1 - fl.same_top_rate)
            pinned = f"{f.kl_mean_mnats / fl.kl_mean_mnats:.2f}/{f.kl_p99_mnats / fl.kl_p99_mnats:.2f}/{pin_miss:.2f}"
        ff = d.free_forced
        own = "-"
        if ff is not None and ff.positions:
            own = f"{_f(ff.kl_mean_mnats)}/{_f(ff.kl_p99_mnats)} ({ff.positions})"
            if d.disagrees:
                own += " DISAGREE"
        c = r.result.counts
        verdict = f"{r.result.verdict} (exit {r.result.exit_code}; {c['defects']}d)"
        table.append(
            [
                r.name,
                r.kind,
                str(f.positions),
                f"{_f(f.kl_mean_mnats)} ± {_f(f.kl_se_mnats)}" if f.positions else "-",
                _f(f.kl_median_mnats),
                _f(f.kl_p99_mnats),
                _f(f.kl_max_mnats, ".1f"),
                _f(None if f.same_top_rate is None else 100 * f.same_top_rate, ".2f"),
                _f(f.dp_rms_pct),
                ratio,
                pinned,
                own,
                dist,
                verdict,
            ]
        )
    widths = [max(len(x[i]) for x in [head, *table]) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    say(line(head))
    say("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for t in table:
        say(line(t))
    say("")
    say(
        f"honest floor measured here (maxima over the honest variants): mean KL {fl_mean:.3f} mnats, p99 KL "
        f"{fl_p99:.3f} mnats, same top {100 * fl_same:.2f}% ({which})"
    )
    real = [r for r in rows if r.kind in realistic and r.result.distribution.overall.positions]
    if real and fl_mean > 0 and fl_p99 > 0:
        worst = []
        for r in real:
            f = r.result.distribution.overall
            miss = (1 - f.same_top_rate) / (1 - fl_same) if fl_same < 1 else float("inf")
            worst.append((max(f.kl_mean_mnats / fl_mean, f.kl_p99_mnats / fl_p99, miss), r.name))
        worst.sort()
        say(
            "realistic candidates, the largest of their three ratios to the honest floor (mean KL, p99 KL, "
            "same-top misses), smallest first: " + ", ".join(f"{n} {x:.2f}" for x, n in worst)
        )
    pin_floor = next((r.result.distribution.floor for r in rows if r.result.distribution.floor is not None), None)
    if pin_floor is None:
        say("the committed pin carries no floor: every variant is judged without the distribution verdict")
    else:
        say(
            f"the committed pin's floor: mean KL {pin_floor.kl_mean_mnats:g}, p99 KL {pin_floor.kl_p99_mnats:g} "
            f"mnats, same top {100 * pin_floor.same_top_rate:g}%, margin {pin_floor.margin:g} "
            f"({pin_floor.measured_by})"
        )
    n_honest = sum(1 for r in rows if r.kind == honest)
    failing = sum(1 for r in rows if r.kind == honest and r.result.exit_code != 0)
    caught = sum(1 for r in real if r.result.exit_code != 0)
    say(
        f"under the pin's whole doctrine: honest variants failing {failing}/{n_honest}; realistic candidates "
        f"not passing {caught}/{len(real)}"
    )
