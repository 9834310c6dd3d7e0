"""The separation study: which distribution statistic puts honest engines far inside the floor
and lossy builds far outside it (docs/studies/separation-study.md). Pure: reads traces.

    python scripts/study_separation.py TRACES_DIR [--reference FP32_TRACE] [--json OUT]

TRACES_DIR holds the candidate traces `scripts/doctrine_study.py run` writes (NAME.jsonl
and NAME.meta.json, kind honest / realistic / mutant / reference). The float32 reference is
`--reference` (a trace whose records carry `forced_top_logprobs` along every pinned prompt,
as the study's `fp32-opinion` variant writes it), else the default pin's own
`reference_top_logprobs`. For each variant, at the positions the distribution verdict
measures, it prints the figures against the bf16 oracle (today's statistic) and against the
float32 reference, each also noise-normalised (each position's KL divided by the square of
the bf16 grid step at the oracle's top logit, floored at |logit| 16), then the honest maxima,
and every variant's figures as multiples of limits set at 1.5 x the honest maxima: the
ratio (the largest figure over its limit) must be <= 0.67 for honest variants and >= 1.5
for lossy builds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
FIGS = ("mean", "p99", "miss")
STATS = ("oracle", "oracle/step2", "fp32", "fp32/step2", "fp32/excess")


def _stats(pts: Sequence[Any], steps: Mapping[tuple[str, int], float]) -> dict[str, float]:
    from gate.core.verdict.distribution import quantile

    kls = sorted(p.kl_mnats for p in pts)
    norm = sorted(p.kl_mnats / steps[(p.prompt_id, p.position)] ** 2 for p in pts)
    n = len(pts)
    miss = sum(not p.same_top for p in pts) / n if n else 0.0
    return {
        "n": n,
        "mean": math.fsum(kls) / n if n else 0.0,
        "p99": quantile(kls, 0.99) or 0.0,
        "miss": miss,
        "nmean": math.fsum(norm) / n if n else 0.0,
        "np99": quantile(norm, 0.99) or 0.0,
        "median": quantile(kls, 0.5) or 0.0,
        "p90": quantile(kls, 0.9) or 0.0,
        "trim95": math.fsum(kls[: int(0.95 * n)]) / max(1, int(0.95 * n)),
        "se": (math.fsum((k - math.fsum(kls) / n) ** 2 for k in kls) / (n - 1) / n) ** 0.5 if n > 1 else 0.0,
    }


def score(traces: Path, reference_path: Path | None) -> list[dict[str, Any]]:
    from gate.core.pins.pin import doctrine_for, load_pin
    from gate.core.traces.reader import read_trace
    from gate.core.traces.trace import PromptRecord, Trace, TraceHeader
    from gate.core.verdict.adjudicate import compare
    from gate.core.verdict.distribution import points
    from gate.core.verdict.grid import grid_step
    from gate.core.verdict.own_lists import candidate_evidence
    from gate.core.verdict.reference import oracle_own_mean, reference_of

    pin = load_pin(MODEL)
    oracle = pin.trace
    whole = doctrine_for(pin)
    if reference_path is not None:
        fp32 = read_trace(reference_path, role="candidate")
        ref = {r.id: r.forced_top_logprobs for r in fp32.records}
    else:
        ref = reference_of(oracle)
    assert ref is not None, "no float32 reference"
    steps = {}
    for o in oracle.records:
        for i, tl in enumerate(o.token_logits or ()):
            steps[(o.id, i)] = 1000.0 * grid_step(max(abs(float(tl)), 16.0))
    rows = []
    # The pin itself as a candidate: the oracle's own numbers, honest by definition.
    itself = Trace(
        TraceHeader("candidate", oracle.header.model, oracle.header.top_k, dict(oracle.header.engine)),
        tuple(
            PromptRecord(
                id=r.id, prompt_token_ids=r.prompt_token_ids, token_ids=r.token_ids, top_logprobs=r.top_logprobs
            )
            for r in oracle.records
        ),
        path="<the pin itself>",
    )
    found: list[tuple[str, str, Any]] = [("pin-itself", "honest", itself)]
    for path in sorted(traces.glob("*.jsonl")):
        meta_path = path.with_suffix(".meta.json")
        if not meta_path.exists():
            continue
        meta = json.loads(meta_path.read_text())
        if meta["kind"] == "reference" or meta.get("pins"):
            continue
        found.append((path.stem, meta["kind"], read_trace(path, role="candidate")))
    for name, kind, cand in found:
        res = compare(oracle, cand, whole)
        outcomes = {p.id: p.outcomes for p in res.prompts}
        ev = candidate_evidence(oracle, cand)
        row: dict[str, Any] = {"name": name, "kind": kind, "exit": res.exit_code}
        row["oracle"] = _stats(points(oracle, cand, outcomes, ev), steps)
        pts = points(oracle, cand, outcomes, ev, reference=ref)
        row["fp32"] = _stats(pts, steps)
        at = [(p.prompt_id, p.position) for p in pts]
        row["fp32"]["base"] = oracle_own_mean(oracle, ref, at) or 0.0
        diffs = [p.kl_mnats - (oracle_own_mean(oracle, ref, [k]) or 0.0) for p, k in zip(pts, at, strict=True)]
        m = math.fsum(diffs) / len(diffs)
        row["fp32"]["se_excess"] = math.sqrt(math.fsum((d - m) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs))
        # Each position (prompt, KL from float32, same top, the oracle's own KL there): the shards' figures.
        row["pos"] = [(p.prompt_id, p.kl_mnats, p.same_top, p.kl_mnats - d) for p, d in zip(pts, diffs, strict=True)]
        rows.append(row)
    return rows


def figures(row: Mapping[str, Any], stat: str) -> dict[str, float]:
    base, _, norm = stat.partition("/")
    s = row[base]
    if norm == "excess":  # the mean less the oracle's own mean KL from the reference (the verdict's)
        return {"mean": s["mean"] - s["base"], "p99": s["p99"], "miss": s["miss"]}
    if norm:
        return {"mean": s["nmean"], "p99": s["np99"], "miss": s["miss"]}
    return {"mean": s["mean"], "p99": s["p99"], "miss": s["miss"]}


def report(rows: Sequence[Mapping[str, Any]], margin: float) -> None:
    honest = [r for r in rows if r["kind"] == "honest"]
    lossy = [r for r in rows if r["kind"] == "realistic"]
    for stat in STATS:
        floor = {f: max(figures(r, stat)[f] for r in honest) for f in FIGS}
        # A floor with no honest miss at all counts one miss in the positions measured.
        floor["miss"] = max(floor["miss"], 1.0 / min(r[stat.split("/")[0]]["n"] for r in honest))
        lim = {f: floor[f] * margin for f in FIGS}
        print(
            f"\n## {stat}: honest maxima mean {floor['mean']:.4g}, p99 {floor['p99']:.4g}, miss {floor['miss']:.4f};"
            f" limits x{margin:g}"
        )
        print("| variant | kind | positions | mean | p99 | miss % | mean/lim | p99/lim | miss/lim | ratio |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in [*honest, *lossy, *[r for r in rows if r["kind"] not in ("honest", "realistic")]]:
            f = figures(r, stat)
            rat = {k: f[k] / lim[k] for k in FIGS}
            n = r[stat.split("/")[0]]["n"]
            print(
                f"| {r['name']} | {r['kind']} | {n} | {f['mean']:.4g} | {f['p99']:.4g} | {100 * f['miss']:.2f} | "
                f"{rat['mean']:.2f} | {rat['p99']:.2f} | {rat['miss']:.2f} | {max(rat.values()):.2f} |"
            )
        worst_honest = max(max(figures(r, stat)[k] / lim[k] for k in FIGS) for r in honest)
        best_lossy = min((max(figures(r, stat)[k] / lim[k] for k in FIGS) for r in lossy), default=float("nan"))
        print(
            f"worst honest ratio {worst_honest:.2f}, nearest lossy ratio {best_lossy:.2f}, "
            f"separation {best_lossy / worst_honest:.2f}"
        )


def final_table(rows: Sequence[Mapping[str, Any]], old: Any, new: Any) -> None:
    """One row per variant: against the bf16 oracle under the pin's `floor` (`old`), and
    against the float32 reference under `new` (a `reference_floor`, the mean as an excess)."""
    from gate.core.verdict.floor_check import ratio_of

    def fig(mean: float, p99: float, miss: float) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(kl_mean_mnats=mean, kl_p99_mnats=p99, same_top_rate=1.0 - miss)

    print(
        "\n| variant | kind | vs oracle: mean / p99 KL (mnats), same top | ratio (pin floor) | "
        "vs float32: mean KL, the oracle's own, excess ± se | p99 KL | same top | ratio (reference floor) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    order = {"honest": 0, "realistic": 1, "borderline": 2}
    for r in sorted(rows, key=lambda r: order.get(r["kind"], 3)):
        o, f = r["oracle"], r["fp32"]
        ro = ratio_of(fig(o["mean"], o["p99"], o["miss"]), old)
        rn = ratio_of(fig(f["mean"], f["p99"], f["miss"]), new, f["base"])
        print(
            f"| {r['name']} | {r['kind']} | {o['mean']:.3f} / {o['p99']:.2f}, {100 * (1 - o['miss']):.2f}% | "
            f"{ro:.2f} | {f['mean']:.3f}, {f['base']:.3f}, {f['mean'] - f['base']:+.3f} ± {f['se_excess']:.3f} | "
            f"{f['p99']:.2f} | {100 * (1 - f['miss']):.2f}% | **{rn:.2f}** |"
        )


SHARD_COUNTS = (1, 2, 3, 4, 6, 8, 12)


def shard_table(rows: Sequence[Mapping[str, Any]], new: Any) -> None:
    """Every variant's run cut into `gate run --shard K/N` slices (the prompts `shard_of` puts in
    slice K), each judged on its own positions under `new` (a `reference_floor`) when it has at
    least `MIN_POSITIONS`: how far the excess scatters with evidence size, how many honest
    slices land beyond the limit and how many lossy slices inside it."""
    from gate.core.traces.shards import shard_of
    from gate.core.verdict.distribution import MIN_POSITIONS, quantile
    from gate.core.verdict.floor_check import ratio_of

    print(
        "\n| shards | positions per shard | honest excess: spread (sd) | honest shards beyond (ratio > 1) "
        "| worst honest ratio | by the mean / p99 / same top | lossy shards inside (ratio <= 1) | nearest lossy ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n in SHARD_COUNTS:
        sizes: list[int] = []
        excess: list[float] = []
        honest: list[float] = []
        lossy: list[float] = []
        by = [0, 0, 0]  # honest slices beyond, by which figure (mean, p99, same top)
        for r in rows:
            if r["kind"] not in ("honest", "realistic") or r["name"] == "real-penalised-sampler":
                continue
            for k in range(1, n + 1):
                part = [q for q in r["pos"] if shard_of(q[0], n) == k]
                if len(part) < MIN_POSITIONS:
                    continue
                kls = sorted(q[1] for q in part)
                ex = math.fsum(q[1] - q[3] for q in part) / len(part)
                miss = sum(not q[2] for q in part) / len(part)
                fig = {"kl_mean_mnats": ex, "kl_p99_mnats": quantile(kls, 0.99), "same_top_rate": 1.0 - miss}
                rat = ratio_of(_ns(fig), new)
                if r["kind"] == "honest":
                    sizes.append(len(part))
                    excess.append(ex)
                    honest.append(rat)
                    each = (
                        ex / new.kl_mean_limit,
                        fig["kl_p99_mnats"] / new.kl_p99_limit,
                        miss / new.same_top_miss_limit,
                    )
                    for i, x in enumerate(each):
                        by[i] += x > 1
                else:
                    lossy.append(rat)
        if not honest:
            continue
        mu = math.fsum(excess) / len(excess)
        sd = math.sqrt(math.fsum((e - mu) ** 2 for e in excess) / max(1, len(excess) - 1))
        print(
            f"| {n} | {min(sizes)}-{max(sizes)} | {sd:.3f} | {sum(x > 1 for x in honest)} of {len(honest)} | "
            f"{max(honest):.2f} | {by[0]} / {by[1]} / {by[2]} | "
            f"{sum(x <= 1 for x in lossy)} of {len(lossy)} | {min(lossy):.2f} |"
        )


def _ns(fig: Mapping[str, Any]) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(**fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", type=Path)
    ap.add_argument("--reference", type=Path, default=None)
    ap.add_argument("--margin", type=float, default=1.5)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--floor", type=Path, default=None, help="a reference_floor (JSON) for the final table")
    a = ap.parse_args(argv)
    rows = score(a.traces, a.reference)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    report(rows, a.margin)
    if a.floor is not None:
        from gate.core.pins.pin import doctrine_for, load_pin
        from gate.core.verdict.floor import Floor

        old = doctrine_for(load_pin(MODEL)).floor
        new = Floor.from_dict(json.loads(a.floor.read_text()), str(a.floor))
        final_table(rows, old, new)
        shard_table(rows, new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
