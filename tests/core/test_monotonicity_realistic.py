"""Less evidence is never a laxer verdict, on the traces realistic candidates write: the
doctrine study's builds (weights quantised, a lossy KV cache, a decode path off by one, a
bias at late positions) run on a tiny random Llama against its own pin, as `gate run`
records them (free run with top-k, teacher-forced with top-k where they diverged), each
failing; then every evidence-reducing cut, alone and in random sequences, and the verdict
stays not a pass. The honest engine (the pin's own) passes, judged.

Slow: it loads a tiny model (built from a config, nothing downloaded) a few times.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from helpers.evidence_cuts import CUTS, apply_cuts

pytestmark = pytest.mark.slow


def _record(engine: Any, pin: Any) -> Any:
    from gate.workflows.run.core import force_diverged, run_candidate

    try:
        free = run_candidate(engine, pin)
        cand, _ = force_diverged(engine, pin, free)
    finally:
        engine.close()
    return cand


def test_realistic_candidates_stay_failing_under_every_evidence_cut(tmp_path: Path) -> None:
    from helpers.tiny_pin import MODEL, build_tiny_pin, one_thread

    from gate.core.pins.pin import load_pin
    from gate.core.verdict.adjudicate import compare
    from gate.core.verdict.doctrine import Doctrine, Evidence
    from gate.core.verdict.floor import Floor
    from gate.engines.hf.engine import HFEngine
    from gate.engines.hf.mutants import (
        ConfinedRunnerUpHFEngine,
        DecodePositionShiftedHFEngine,
        KVQuantisedHFEngine,
        WeightQuantisedHFEngine,
    )
    from gate.errors import InputError

    with one_thread():
        weights, pins = build_tiny_pin(tmp_path)
        pin = load_pin(MODEL, pins)
        w = str(weights)
        honest = _record(HFEngine(w), pin)
        builds = {
            "weights-int4": _record(WeightQuantisedHFEngine(w, bits=4, group=32), pin),
            "kv-fp8": _record(KVQuantisedHFEngine(w, kv="fp8"), pin),
            "decode-position+1": _record(DecodePositionShiftedHFEngine(w, shift=1), pin),
            "runner-up+3-late": _record(ConfinedRunnerUpHFEngine(w, steps=3, from_position=8), pin),
        }
    # The pin is the HF engine's own run, so honest drift here is 0: a floor just above it.
    floor = Floor(kl_mean_mnats=0.05, kl_p99_mnats=1.0, same_top_rate=0.99, margin=1.5, measured_by="test")
    doctrine = Doctrine(near_tie_ulps=2.0, evidence=Evidence(4.0, 2.0, 2.0), floor=floor)
    r = compare(pin.trace, honest, doctrine)
    assert r.exit_code == 0 and r.distribution is not None and r.distribution.judged, r.summary

    def not_a_pass(cand: Any) -> bool:
        try:
            return compare(pin.trace, cand, doctrine).exit_code != 0
        except InputError:
            return True

    rng = random.Random(0)
    names = sorted(CUTS)
    for name, cand in builds.items():
        assert not_a_pass(cand), name
        for cut in names:
            for seed in range(3):
                assert not_a_pass(apply_cuts(cand, pin.trace, [(cut, seed)])), (name, cut, seed)
        for _ in range(40):
            cuts = [(rng.choice(names), rng.randrange(2**31)) for _ in range(rng.randrange(1, 5))]
            assert not_a_pass(apply_cuts(cand, pin.trace, cuts)), (name, cuts)
        # Many entries replaced by tokens the oracle does not list: never a pass.
        many = [("replace_unlisted", s) for s in range(200)]
        assert not_a_pass(apply_cuts(cand, pin.trace, many)), name
