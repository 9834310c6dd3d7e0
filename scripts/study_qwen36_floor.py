"""The honest spread on the Qwen3.6 test checkpoint: `gate run` of every honest build and kernel
path against its pin, and the planted DeltaNet faults, in one table (docs/results/qwen36-tiny.md).

    python scripts/study_qwen36_floor.py run   [--out .work/qwen36-floor] [--only NAME ...]
    python scripts/study_qwen36_floor.py table [--out .work/qwen36-floor]

`run` runs `gate run --model gate-llm/Qwen3.6-tiny --format json` once per variant not yet in
the folder, each in its own process and environment (torch's kernel ISA `ATEN_CPU_CAPABILITY`,
threads), under the lock `$GATE_STUDY_LOCK` names (else `<out>/study.lock`), and keeps the JSON
report. `table` is pure: for each variant the verdict and counts, the largest oracle gap
(mnats) at a divergence that is not an exact tie (what the near-tie threshold must cover for
the honest builds to pass, and what a planted fault stays above), and the KL figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from doctrine_study import ONE_THREAD, lock_file  # noqa: E402  (beside this script: one lock, one thread, for both studies)

MODEL = "gate-llm/Qwen3.6-tiny"
DEFAULT_OUT = REPO / ".work" / "qwen36-floor"
ONE = {"threads": "1"}


@dataclass(frozen=True)
class Variant:
    name: str
    honest: bool
    what: str
    engine: str = "hf"
    options: Mapping[str, str] = field(default_factory=lambda: dict(ONE))
    env: Mapping[str, str] = field(default_factory=dict)


VARIANTS: tuple[Variant, ...] = (
    Variant("hf-bf16", True, "transformers bf16 (the pin's own engine and settings)"),
    Variant("hf-isa-avx2", True, "transformers bf16, ATEN_CPU_CAPABILITY=avx2", env={"ATEN_CPU_CAPABILITY": "avx2"}),
    Variant(
        "hf-isa-default", True, "transformers bf16, ATEN_CPU_CAPABILITY=default", env={"ATEN_CPU_CAPABILITY": "default"}
    ),
    Variant(
        "hf-threads-2", True, "transformers bf16, 2 threads", options={"threads": "2"}, env={"OMP_NUM_THREADS": "2"}
    ),
    Variant("hf-float32", True, "transformers float32", options={**ONE, "dtype": "float32"}),
    Variant(
        "hf-float32-avx2",
        True,
        "transformers float32, ATEN_CPU_CAPABILITY=avx2",
        options={**ONE, "dtype": "float32"},
        env={"ATEN_CPU_CAPABILITY": "avx2"},
    ),
    Variant("llamacpp", True, "llama.cpp, the bf16 GGUF", engine="llamacpp"),
    Variant("llama-server", True, "llama-server, the bf16 GGUF (prompt cache on)", engine="llama-server"),
    Variant("mlx", True, "MLX (CPU), the float32 mlx-lm folder", engine="mlx", options={}),
    Variant(
        "planted-deltanet-out-x1.5",
        False,
        "layer 0's DeltaNet out_proj scaled by 1.5 (tests/helpers/planted_deltanet.py)",
        engine="helpers.planted_deltanet:DeltaNetOutScale",
    ),
)
BY_NAME = {v.name: v for v in VARIANTS}


def run_all(out: Path, only: Sequence[str]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    unknown = [n for n in only if n not in BY_NAME]
    if unknown:
        print(f"unknown variant(s): {', '.join(unknown)} (known: {', '.join(BY_NAME)})", file=sys.stderr)
        return 2
    failed = 0
    for v in [BY_NAME[n] for n in dict.fromkeys(only)] if only else VARIANTS:
        target = out / f"{v.name}.json"
        if target.exists():
            print(f"[{v.name}] measured already, skipped", flush=True)
            continue
        env = {**os.environ, **ONE_THREAD, **v.env}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests")])
        opts = [x for k, val in v.options.items() for x in ("--engine-opt", f"{k}={val}")]
        cmd = ["flock", str(lock_file(out)), sys.executable, "-m", "gate", "run", "--model", MODEL]
        cmd += ["--engine", v.engine, *opts, "--format", "json"]
        t0 = time.time()
        r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=1800)
        took = time.time() - t0
        if r.returncode not in (0, 1):
            print(f"[{v.name}] exit {r.returncode} after {took:.0f}s: {r.stderr.strip()[-400:]}", flush=True)
            failed += 1
            continue
        report = json.loads(r.stdout)
        report["study"] = {"variant": v.name, "what": v.what, "env": dict(v.env), "command": cmd[3:], "s": took}
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(target)
        print(f"[{v.name}] {report['verdict']} after {took:.0f}s", flush=True)
    return 1 if failed else 0


def row(v: Variant, report: Mapping[str, Any]) -> list[str]:
    c = report["counts"]
    divs = report["divergences"]
    gaps = [d["oracle_minus_candidate_mnats"] for d in divs if d["class"] != "exact_tie"]
    gaps = [g for g in gaps if g is not None]
    dist = report.get("distribution") or {}
    kl = dist.get("kl_mnats") or {}
    same = (dist.get("same_top") or {}).get("rate")
    routing = report.get("routing") or {}
    flips = None if routing.get("without_routing_data") else routing.get("routing_caused")
    return [
        v.name,
        "honest" if v.honest else "planted",
        report["verdict"],
        f"{c['strict_pass']}/{c['prompts']}",
        f"{c['positions_matched']}/{c['positions']}",
        f"{c['ratified_pass']}/{c['prompts']}",
        f"{c.get('exact_ties', 0)} / {c.get('near_ties', 0)} / {c.get('defects', 0)}",
        f"{max(gaps):.0f}" if gaps else "-",
        f"{kl['mean']:.2f} / {kl['p99']:.2f}" if kl.get("mean") is not None else "-",
        f"{same * 100:.2f}%" if same is not None else "-",
        "no data" if flips is None else str(flips),
    ]


def table(out: Path) -> int:
    head = [
        "variant",
        "kind",
        "verdict",
        "strict",
        "positions",
        "ratified",
        "exact / near / defects",
        "max gap (mnats)",
    ]
    head += ["KL mean / p99 (mnats)", "same top", "after a routing flip"]
    rows = [
        row(v, json.loads((out / f"{v.name}.json").read_text())) for v in VARIANTS if (out / f"{v.name}.json").exists()
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths], *rows]:
        print("| " + " | ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)) + " |")
    honest = [float(r[7]) for r in rows if r[1] == "honest" and r[7] != "-"]
    print(f"\nlargest oracle gap at an honest flip that is not an exact tie: {max(honest, default=0):.0f} mnats")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=["run", "table"])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", nargs="*", default=[])
    a = ap.parse_args(argv)
    return run_all(a.out, a.only) if a.stage == "run" else table(a.out)


if __name__ == "__main__":
    sys.exit(main())
