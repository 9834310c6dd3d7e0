"""A run's distribution figures against a floor's limits (`gate.core.verdict.distribution`):
which figures are beyond, in words, and how close the run came (`ratio_of`).

Against the float32 reference (`gate.core.verdict.reference`) the mean is judged as an
*excess*: the candidate's mean KL from the reference less the oracle's own mean KL from it
over the same positions (`baseline`). An honest bf16 engine rounds about as much as the
oracle does, so its excess sits near 0 whatever the model's rounding noise is; a lossy
build adds its loss. The p99 and the same-top rate are judged as they are.

Pure: no I/O, no torch.
"""

from __future__ import annotations

from typing import Protocol

from gate.core.verdict.floor import Floor


class Figures(Protocol):
    """What is judged of a run's figures (`gate.core.verdict.distribution.Figures`)."""

    @property
    def kl_mean_mnats(self) -> float | None: ...
    @property
    def kl_p99_mnats(self) -> float | None: ...
    @property
    def same_top_rate(self) -> float | None: ...


def ratio_of(f: Figures, floor: Floor, baseline: float = 0.0) -> float | None:
    """The largest of `f`'s mean KL (less `baseline`), p99 KL and same-top miss rate over its limit."""
    if f.kl_mean_mnats is None or f.kl_p99_mnats is None or f.same_top_rate is None:
        return None
    return max(
        (f.kl_mean_mnats - baseline) / floor.kl_mean_limit,
        f.kl_p99_mnats / floor.kl_p99_limit,
        (1.0 - f.same_top_rate) / floor.same_top_miss_limit if floor.same_top_miss_limit > 0 else 0.0,
    )


def limits(floor: Floor) -> dict[str, float]:
    return {
        "kl_mean_mnats": floor.kl_mean_limit,
        "kl_p99_mnats": floor.kl_p99_limit,
        "same_top_rate": 1.0 - floor.same_top_miss_limit,
    }


def beyond_floor(f: Figures, floor: Floor, against: str = "", baseline: float | None = None) -> tuple[str, ...]:
    """Each figure of `f` beyond the floor's limit, said with its numbers (`against`: what the
    figures were measured against, when not the oracle: "float32 reference"; `baseline`: the
    oracle's own mean KL from it, which the mean is judged in excess of)."""
    out: list[str] = []
    m = f"{floor.margin:g}"
    vs = f" vs the {against}" if against else ""
    if f.kl_mean_mnats is not None:
        excess = f.kl_mean_mnats - (baseline or 0.0)
        if excess > floor.kl_mean_limit:
            if baseline is None:
                out.append(
                    f"mean KL{vs} {f.kl_mean_mnats:.3f} mnats > {floor.kl_mean_limit:.3f} "
                    f"(honest floor {floor.kl_mean_mnats:g} x margin {m})"
                )
            else:
                out.append(
                    f"mean KL{vs} {f.kl_mean_mnats:.3f} mnats, {excess:.3f} beyond the oracle's own "
                    f"{baseline:.3f} > {floor.kl_mean_limit:.3f} (honest excess floor {floor.kl_mean_mnats:g} "
                    f"x margin {m})"
                )
    if f.kl_p99_mnats is not None and f.kl_p99_mnats > floor.kl_p99_limit:
        out.append(
            f"p99 KL{vs} {f.kl_p99_mnats:.3f} mnats > {floor.kl_p99_limit:.3f} "
            f"(honest floor {floor.kl_p99_mnats:g} x margin {m})"
        )
    if f.same_top_rate is not None and 1.0 - f.same_top_rate > floor.same_top_miss_limit:
        out.append(
            f"same top{vs} {100 * f.same_top_rate:.2f}% < {100 * (1 - floor.same_top_miss_limit):.2f}% "
            f"(honest floor {100 * floor.same_top_rate:g}%, misses x margin {m})"
        )
    return tuple(out)
