"""The margin of `gate diagnose`: honest variants of the HF engine (gate.workflows.diagnose.variants:
ISA paths in their own processes, thread counts, eager attention) against this process's
reference (float32) and honest band (bfloat16), made as `gate diagnose` makes them, on both
paths (the decode path: a prefill over the context before the position's last token, then its
decode step); prints each variant's largest
ratio to the band over every capture point. MARGIN (gate.core.diagnosis.metric) must sit
above all of them.

    flock /tmp/gate-heavy.lock env OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python scripts/diagnose_margin.py
"""

from __future__ import annotations

import argparse


def main() -> None:
    import torch

    from gate.core.diagnosis.locate import compare_path
    from gate.core.diagnosis.metric import MARGIN
    from gate.core.pins.pin import load_pin
    from gate.models.default import DEFAULT_MODEL, resolve_model_path
    from gate.workflows.diagnose.core import Timings, as_path, decode_prompt, reference_and_band, target_given
    from gate.workflows.diagnose.variants import capture_in_subprocess, runnable_variants

    parser = argparse.ArgumentParser()
    parser.add_argument("--position", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pin = load_pin(DEFAULT_MODEL)
    path = resolve_model_path(DEFAULT_MODEL)
    overall = 0.0
    paths = ("decode", "prefill")
    for rec in pin.trace.records[: args.prompts]:
        t = target_given(pin, rec.id, min(args.position, len(rec.token_ids) - 1))
        # The reference and band exactly as `gate diagnose` makes them for an engine's own paths.
        stepped = decode_prompt(t)
        ref, bands, _ = reference_and_band(t, path, "bfloat16", paths, stepped, len(stepped) - 1, Timings())
        for name, (env, opts) in runnable_variants().items():
            got = capture_in_subprocess(path, opts, env, stepped, t.context_ids, paths)
            for p, cand in got.items():
                f = compare_path(as_path(ref, p), bands[p], cand)
                w = max(f.layers, key=lambda e: e.ratio)
                overall = max(overall, w.ratio)
                where = "none" if f.first is None else f"{f.first.layer} {f.first.part}"
                print(f"{rec.id} {p:7} {name:16} worst {w.ratio:5.2f}x at {w.module} ({w.part}); located: {where}")
    print(f"largest honest ratio {overall:.2f}x; MARGIN {MARGIN:g}")


if __name__ == "__main__":
    main()
