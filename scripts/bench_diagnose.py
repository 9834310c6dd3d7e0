"""One `gate diagnose` on the default model: wall time and peak memory as ratios against a plain
forward (one prefill) of the same context by the same candidate engine, in the same process
(the median of ten: five before the diagnoses, five after; peak memory against the five before).

    flock /tmp/gate-heavy.lock env OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python scripts/bench_diagnose.py
    ... scripts/bench_diagnose.py --model gate-llm/Qwen3.6-tiny   # gate's Qwen3.6 test checkpoint

Three diagnoses of the same position: with nothing cached (the first diagnosis of a model on
a machine: its weights are hashed for the cache's key), with the weights' digests known (the
first diagnosis of a position: the reference and the band computed), and with gate's
diagnosis cache kept from the one before (the position diagnosed again: another candidate, a
fixed build). `--repeat N`: the second N times, each with a cache of its own and over a plain
prefill measured just before it, and the median of those ratios (one run moves with the machine).

Peak memory is the process's resident set, sampled every 2 ms by a thread, during each step
(the candidate already loaded before all); the diagnosis loads the honest engine (bfloat16)
itself and widens it to the float32 reference (or loads the reference), and its time includes
those loads and both paths. The breakdown is the diagnosis's own phases
(gate.workflows.diagnose.core.Timings): the cache (hashing the weights, reading and writing the
entry), loading the honest engine and making the reference, each engine's captures (both
paths together; the honest one includes its band), and the comparison; "other" is what lies
between them.

The work count: each engine's forward passes during the diagnosis (a call of the model's token
embedding) and the tokens they process, in prefill-equivalents (tokens over the context's
length), by phase (the honest engine's, the reference's, the candidate's captures).

`--wide`: the same on a wider checkpoint of the test checkpoint's architecture
(Qwen3_5MoeForConditionalGeneration, the test checkpoint's config widened and deepened, seeded
random weights, built into a temporary folder), where a plain prefill costs what a forward costs
rather than Python's fixed costs; the position is the test checkpoint's pin's (same tokenizer).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

cpu: list[float] = []


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measured(fn: Callable[[], Any]) -> tuple[float, int, Any]:
    """(seconds, peak RSS in bytes while it ran, its result); the process's CPU seconds in
    `cpu[-1]` (on a shared machine they move less than wall time with the other jobs)."""
    peak = rss()
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss())
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    start, start_cpu = time.perf_counter(), time.process_time()
    out = fn()
    seconds = time.perf_counter() - start
    cpu.append(time.process_time() - start_cpu)
    done.set()
    t.join()
    return seconds, max(peak, rss()), out


def main() -> None:
    import torch

    from gate.core.pins.pin import load_pin
    from gate.engines.hf.engine import HFEngine
    from gate.models.default import DEFAULT_MODEL, resolve_model_path
    from gate.workflows.diagnose.core import target_given

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a model with a pin (default: gate's default model)")
    parser.add_argument("--position", type=int, default=16)
    parser.add_argument("--prompt", default=None)
    parser.add_argument("--wide", action="store_true", help="a wider random checkpoint of --model's architecture")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="the first diagnosis of the position (cache empty) N times, each with a cache of its own and "
        "against a plain prefill measured just before it; their median (one run moves with the machine)",
    )
    parser.add_argument(
        "--experts",
        default=None,
        metavar="COUNT,PER_TOKEN,WIDTH",
        help="with --wide: its MoE blocks' expert count, experts per token and expert width "
        "(256,8,64: Qwen3.6-35B-A3B's count and ratio; default 32,4,256)",
    )
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: expected at least 1")
    torch.set_num_threads(1)
    pin = load_pin(args.model)
    prompt = args.prompt or pin.trace.records[0].id
    target = target_given(pin, prompt, args.position)
    with tempfile.TemporaryDirectory() as wide_dir:
        experts = tuple(int(x) for x in args.experts.split(",")) if args.experts else None
        model = build_wide(resolve_model_path(args.model), Path(wide_dir), experts) if args.wide else args.model
        bench(HFEngine(model), pin, target, prompt, args)


def bench(engine: Any, pin: Any, target: Any, prompt: str, args: argparse.Namespace) -> None:
    import torch

    from gate.workflows.diagnose.core import Timings, diagnose_engine

    ids = list(target.context_ids)

    def plain() -> Any:
        with torch.inference_mode():
            return engine._prefill(ids)

    plain()  # warm
    # The unit: the median of ten plain prefills, five before the diagnoses and five after (one
    # sample moves with the machine's other jobs, and the machine's speed drifts over a run).
    samples = [measured(plain) for _ in range(5)]
    before_cpu = cpu[-5:]

    def one(timings: Timings) -> Any:
        return diagnose_engine(engine, target, engine.model_path, model=pin.model, timings=timings)

    from gate.core.storage import digests

    known_digests = digests.digest_dir
    n = args.repeat
    runs = [
        # (what, weights hashed, cache folder, over a plain prefill just before it)
        ("nothing cached (weights hashed):", True, "first", False),  # the first diagnosis of a model on this machine
        # the first of a position: the weights' digests known (each repeat with a cache of its own)
        *(
            (f"one diagnosis, cache empty{f' ({i + 1} of {n})' if n > 1 else ''}:", False, f"then{i}", n > 1)
            for i in range(n)
        ),
        # the same position again (another candidate, a fix)
        ("one diagnosis, cache kept:", False, f"then{n - 1}", False),
    ]
    done = []
    paired: list[tuple[float, float]] = []  # each repeat's time, and over the plain prefill just before it
    with tempfile.TemporaryDirectory() as cache_dir, tempfile.TemporaryDirectory() as digest_dir:
        for what, hash_weights, folder, paired_run in runs:
            # An empty cache for each run but the last; the last cache-empty run fills it for the last.
            os.environ["GATE_DIAGNOSE_CACHE_DIR"] = f"{cache_dir}/{folder}"
            digests.digest_dir = (lambda: Path(digest_dir)) if hash_weights else known_digests  # type: ignore[assignment]
            if not hash_weights:  # the weights' digests as any earlier diagnosis of the model left them
                for f in sorted(Path(engine.model_path).iterdir()):
                    if f.is_file():
                        digests.known_sha256(f)
            timings = counted(engine.model.config.get_text_config().vocab_size)
            work = timings.work
            before_s = measured(plain)[0] if paired_run else None
            with timings.counting():
                diag_s, diag_peak, d = measured(functools.partial(one, timings))
            done.append((what, diag_s, cpu[-1], diag_peak, d, timings, work))
            if before_s is not None:
                paired.append((diag_s, diag_s / before_s))
    after = [measured(plain) for _ in range(5)]
    samples += after
    base_s = statistics.median(s for s, _, _ in samples)
    base_cpu = statistics.median(before_cpu + cpu[-5:])
    base_peak = max(peak for _, peak, _ in samples[:5])  # before: what the diagnoses left is theirs
    wide = " (--wide)" if args.wide else ""
    print(f"model {args.model}{wide}, prompt {prompt}, position {args.position}: context {len(ids)} tokens")
    print(f"torch threads {torch.get_num_threads()}, {os.cpu_count()} cores")
    print(line("plain forward (one prefill, median of 10):", base_s, base_cpu, base_peak))
    medians = (statistics.median(s for s, _, _ in samples[:5]), statistics.median(s for s, _, _ in after))
    print(f"  the five before the diagnoses {medians[0] * 1000:.1f} ms, the five after {medians[1] * 1000:.1f} ms")
    for what, diag_s, diag_cpu, diag_peak, d, timings, work in done:
        print(line(what, diag_s, diag_cpu, diag_peak))
        spent = [(k, v, timings.cpu_seconds[k]) for k, v in timings.seconds.items()]
        spent.append(("other", diag_s - sum(timings.seconds.values()), diag_cpu - sum(timings.cpu_seconds.values())))
        for phase, s, c in spent:
            print(f"  {phase + ':':28s} {s * 1000:8.1f} ms, cpu {c * 1000:8.1f} ms ({c / base_cpu:5.1f}x plain cpu)")
        print(
            f"  ratio: time {diag_s / base_s:.1f}x, cpu time {diag_cpu / base_cpu:.1f}x, "
            f"peak memory {diag_peak / base_peak:.2f}x"
        )
        for phase, (calls, tokens) in work.items():
            print(f"  work, {phase + ':':22s} {calls} forwards, {tokens} tokens = {tokens / len(ids):.2f} prefills")
        total = sum(t for _, t in work.values())
        print(f"  work, all: {total} tokens = {total / len(ids):.2f} prefills of the {len(ids)}-token context")
        print(f"  diagnosis: {d.summary}")
    if paired:
        ratios = [r for _, r in paired]
        each = ", ".join(f"{r:.1f}x" for r in ratios)
        overall = statistics.median(s for s, _ in paired) / base_s
        print(
            f"one diagnosis, cache empty, {n} runs: each over the plain prefill just before it {each}; "
            f"median {statistics.median(ratios):.1f}x (over the median of 10: {overall:.1f}x)"
        )


def counted(vocab: int) -> Any:
    """Timings that also count forward passes and tokens by phase (`work`: phase -> [forwards,
    tokens]): a call of a token embedding of the model's vocabulary is a forward over its
    input's tokens."""
    import torch

    from gate.workflows.diagnose.core import Timings

    class Counted(Timings):
        def __init__(self) -> None:
            super().__init__()
            self.work: dict[str, list[int]] = {}
            self.now = "other"

        @contextlib.contextmanager
        def phase(self, name: str) -> Iterator[None]:
            before, self.now = self.now, name
            try:
                with super().phase(name):
                    yield
            finally:
                self.now = before

        @contextlib.contextmanager
        def counting(self) -> Iterator[None]:
            def hook(module: torch.nn.Module, inputs: tuple[Any, ...]) -> None:
                if isinstance(module, torch.nn.Embedding) and module.num_embeddings == vocab and inputs:
                    counts = self.work.setdefault(self.now, [0, 0])
                    counts[0] += 1
                    counts[1] += int(inputs[0].numel())

            handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
            try:
                yield
            finally:
                handle.remove()

    return Counted()


# The wide checkpoint: the test checkpoint's text config with these (a plain prefill of 20
# tokens about half a second on one thread of the bench's machine).
WIDE = {
    "hidden_size": 1024,
    "num_hidden_layers": 8,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
    "head_dim": 128,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "linear_num_key_heads": 8,
    "linear_num_value_heads": 16,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "num_experts": 32,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 256,
    "shared_expert_intermediate_size": 256,
}
SEED = 20261203


def build_wide(tiny: str, out: Path, experts: tuple[int, ...] | None = None) -> str:
    """A seeded random checkpoint of `tiny`'s architecture with the text config widened by
    WIDE (bfloat16, as the test checkpoint), tokenizer files copied; returns its folder.
    `experts`: (count, per token, width) instead of WIDE's."""
    import json
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = json.loads((Path(tiny) / "config.json").read_text())
    wide = dict(WIDE)
    if experts is not None:
        count, per_token, width = experts
        wide.update(num_experts=count, num_experts_per_tok=per_token, moe_intermediate_size=width)
    config["text_config"].update(wide)
    config["vision_config"]["out_hidden_size"] = WIDE["hidden_size"]
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        if (Path(tiny) / name).exists():
            shutil.copy(Path(tiny) / name, out / name)
    torch.manual_seed(SEED)
    model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(out), dtype=torch.bfloat16)
    model.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    print(f"wide checkpoint: {n / 1e6:.0f}M parameters, seed {SEED}, {json.dumps(wide)}")
    return str(out)


def line(what: str, seconds: float, cpu_seconds: float, peak: int) -> str:
    mib = 1 << 20
    return f"{what:30s} {seconds * 1000:8.1f} ms, cpu {cpu_seconds * 1000:8.1f} ms, peak RSS {peak / mib:5.0f} MiB"


if __name__ == "__main__":
    main()
