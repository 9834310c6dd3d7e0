"""The margin of `gate diagnose`: honest variants of the HF engine (gate.workflows.diagnose_variants:
ISA paths in their own processes, thread counts, eager attention) against this process's
reference (float32) and honest band (bfloat16), on both paths; prints each variant's largest
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
    from gate.engines.hf.capture import capture_hf
    from gate.models.default import DEFAULT_MODEL, resolve_model_path
    from gate.workflows.diagnose import reference_engines, target_given
    from gate.workflows.diagnose_variants import HONEST_VARIANTS, capture_in_subprocess

    parser = argparse.ArgumentParser()
    parser.add_argument("--position", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pin = load_pin(DEFAULT_MODEL)
    path = resolve_model_path(DEFAULT_MODEL)
    overall = 0.0
    with reference_engines(path) as (ref, hon):
        for rec in pin.trace.records[: args.prompts]:
            t = target_given(pin, rec.id, min(args.position, len(rec.token_ids) - 1))
            base = {
                p: (capture_hf(ref, t.prompt_ids, t.context_ids, p), capture_hf(hon, t.prompt_ids, t.context_ids, p))
                for p in ("decode", "prefill")
            }
            for name, (env, opts) in HONEST_VARIANTS.items():
                got = capture_in_subprocess(path, opts, env, t.prompt_ids, t.context_ids, ("decode", "prefill"))
                for p, cand in got.items():
                    f = compare_path(*base[p], cand)
                    w = max(f.layers, key=lambda e: e.ratio)
                    overall = max(overall, w.ratio)
                    where = "none" if f.first is None else f"{f.first.layer} {f.first.part}"
                    print(f"{rec.id} {p:7} {name:16} worst {w.ratio:5.2f}x at {w.module} ({w.part}); located: {where}")
    print(f"largest honest ratio {overall:.2f}x; MARGIN {MARGIN:g}")


if __name__ == "__main__":
    main()
