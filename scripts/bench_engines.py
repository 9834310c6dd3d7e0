"""Benchmark an engine's decode loop against its runtime's own generate call, in one run:

1. gate's `generate` (top-k logprobs on) against the runtime's native greedy generate on the
   same model and prompts, time per generated token (goal: no slower, beyond the cost of the
   top-k lists the native call does not make);
2. gate's `force` on the engine's own tokens against gate's `generate`, per token (goal: at
   most 1.1x).

The native call per engine (`--engine`):
- hf: transformers' `model.generate(do_sample=False)`;
- llamacpp: llama-cpp-python's `Llama.generate(tokens, temp=0)` (its host greedy sampler; the
  model reset before each prompt, so no prompt prefix is reused from the previous run);
- ortgenai: onnxruntime-genai's own loop, `og.Generator` with `do_sample=False` and
  `generate_next_token()` until done (no logits read);
- executorch: the program's own method calls with nothing of gate's around them: one
  `forward` over the prompt, then one per token at the next cache position, the pick a
  `torch.argmax` on the runtime's output tensor (no copy, no top-k).

Runs are interleaved prompt by prompt (gate generate, native, gate force, ...) and repeated,
so a machine shared with other jobs slows all three alike; the figures are the median over
repeats of the per-token time summed over all prompts.

    python scripts/bench_engines.py [--engine hf|llamacpp|ortgenai|executorch] [--model ID] [--prompts 8]
        [--max-tokens 32] [--top-k 20] [--threads N] [--engine-opt key=value ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

TEXTS = (
    "import numpy as np",
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
    "Here is a list of fruits:\n-",
    "The quick brown fox",
    "SELECT name FROM users WHERE",
    "In 1969, the first humans",
    "Water boils at",
    "for i in range(10):",
    "The three primary colours are",
)


Runner = Callable[[Any], int]


def hf_setup(args: argparse.Namespace, opts: dict[str, str]) -> tuple[Any, str, Runner, str]:
    import torch

    from gate.engines.hf.engine import HFEngine

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = HFEngine(args.model, device=args.device, dtype=args.dtype, **opts)
    eos = sorted(engine.stop_ids) or None

    def native(p: Any) -> int:
        ids = torch.tensor([list(p.prompt_token_ids)], device=engine.device)
        with torch.inference_mode():
            out = engine.model.generate(
                ids, max_new_tokens=p.max_tokens, do_sample=False, eos_token_id=eos, pad_token_id=(eos or [0])[0]
            )
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        return int(out.shape[1] - ids.shape[1])

    where = f"{engine.device} ({args.dtype}), torch {torch.__version__}, {torch.get_num_threads()} threads"
    return engine, "transformers generate", native, where


def llamacpp_setup(args: argparse.Namespace, opts: dict[str, str]) -> tuple[Any, str, Runner, str]:
    import llama_cpp

    from gate.engines.llamacpp.engine import LlamaCppEngine

    if args.threads:
        opts.setdefault("threads", str(args.threads))
    engine = LlamaCppEngine(args.model, **opts)
    params = engine.context_params
    llm = llama_cpp.Llama(
        model_path=str(engine.gguf),
        n_ctx=params.n_ctx,
        n_batch=params.n_batch,
        n_ubatch=params.n_ubatch,
        n_threads=params.n_threads,
        n_threads_batch=params.n_threads_batch,
        logits_all=False,
        verbose=False,
    )

    def native(p: Any) -> int:
        llm.reset()  # no prompt prefix reused from the previous call
        n = 0
        for token in llm.generate(list(p.prompt_token_ids), temp=0.0, top_k=1, repeat_penalty=1.0):
            n += 1
            if token in engine.stop_ids or n >= p.max_tokens:
                break
        return n

    where = f"llama-cpp-python {llama_cpp.__version__}, {engine.info()['system_info']}, {params.n_threads} threads"
    return engine, "llama-cpp-python generate", native, where


def ortgenai_setup(args: argparse.Namespace, opts: dict[str, str]) -> tuple[Any, str, Runner, str]:
    import numpy as np
    import onnxruntime_genai as og

    from gate.engines.ortgenai.engine import OrtGenAIEngine

    if args.threads:
        opts.setdefault("threads", str(args.threads))
    engine = OrtGenAIEngine(args.model, **opts)

    def native(p: Any) -> int:
        params = og.GeneratorParams(engine.model)
        params.set_search_options(do_sample=False, max_length=len(p.prompt_token_ids) + p.max_tokens, batch_size=1)
        gen = og.Generator(engine.model, params)
        gen.append_tokens(np.array([list(p.prompt_token_ids)], dtype=np.int32))
        n = 0
        while not gen.is_done():
            gen.generate_next_token()
            n += 1
        return n

    where = f"onnxruntime-genai {og.__version__}, {engine.precision}, threads {engine.options['threads'] or 'default'}"
    return engine, "onnxruntime-genai generator", native, where


def executorch_setup(args: argparse.Namespace, opts: dict[str, str]) -> tuple[Any, str, Runner, str]:
    import torch

    from gate.engines.executorch.engine import ExecuTorchEngine

    if args.threads:
        opts.setdefault("threads", str(args.threads))
    engine = ExecuTorchEngine(args.model, **opts)
    method = engine.method

    def native(p: Any) -> int:
        ids = list(p.prompt_token_ids)
        logits = method.execute([torch.tensor([ids]), torch.arange(len(ids))])[0]
        n = 0
        while True:
            token = int(torch.argmax(logits[0, -1]))
            n += 1
            if token in engine.stop_ids or n >= p.max_tokens:
                return n
            at = len(ids) + n - 1
            logits = method.execute([torch.tensor([[token]]), torch.tensor([at])])[0]

    info = engine.info()
    where = f"executorch {info['executorch']}, {info['recipe']} ({info['backend']}), threads {info['threads']}"
    return engine, "executorch method loop", native, where


SETUPS = {"hf": hf_setup, "llamacpp": llamacpp_setup, "ortgenai": ortgenai_setup, "executorch": executorch_setup}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=sorted(SETUPS), default="hf")
    parser.add_argument("--model", default=None, help="model id or folder (default: the embedded default)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="hf only")
    parser.add_argument("--dtype", default="bfloat16", help="hf only")
    parser.add_argument("--threads", type=int, default=None, help="the engine's threads (default: its own choice)")
    parser.add_argument("--engine-opt", action="append", default=[], help="key=value, as for gate run")
    args = parser.parse_args()

    from gate.core.engine import PromptInput
    from gate.models.default import DEFAULT_MODEL

    args.model = args.model or DEFAULT_MODEL
    opts = dict(o.split("=", 1) for o in args.engine_opt)
    started = time.perf_counter()
    engine, native_name, native, where = SETUPS[args.engine](args, opts)
    load_s = time.perf_counter() - started
    texts = [TEXTS[i % len(TEXTS)] for i in range(args.prompts)]
    prompts = []
    for i, text in enumerate(texts):
        ids = engine.encode(text)
        assert ids is not None, "the benchmark needs a model with a tokenizer"
        prompts.append(PromptInput(f"p{i}", ids, args.max_tokens))

    def timed(fn: Callable[[], int]) -> tuple[float, float, int]:
        """(wall seconds, this process's CPU seconds, tokens)."""
        t0, c0 = time.perf_counter(), time.process_time()
        n = fn()
        return time.perf_counter() - t0, time.process_time() - c0, n

    def ours(p: PromptInput) -> int:
        return len(engine.generate([p], args.top_k)[0].token_ids)

    own_tokens = {p.id: engine.generate([p], 0)[0].token_ids for p in prompts}  # also the warm-up

    def forced(p: PromptInput) -> int:
        return len(engine.force(p.prompt_token_ids, own_tokens[p.id], args.top_k).token_ids)

    native(prompts[0])  # warm-up of the native call's own setup
    names = ("gate generate", native_name, "gate force")
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.repeats):
        totals: dict[str, list[float]] = {name: [0.0, 0.0, 0.0] for name in names}
        for p in prompts:
            for name, fn in zip(names, (ours, native, forced), strict=True):
                seconds, cpu_seconds, n = timed(lambda fn=fn, p=p: fn(p))  # type: ignore[misc]
                totals[name][0] += seconds
                totals[name][1] += cpu_seconds
                totals[name][2] += n
        for name, (total_s, total_cpu_s, tokens) in totals.items():
            wall[name].append(total_s / max(tokens, 1.0))
            cpu[name].append(total_cpu_s / max(tokens, 1.0))

    med = {name: statistics.median(v) for name, v in wall.items()}
    med_cpu = {name: statistics.median(v) for name, v in cpu.items()}
    print(f"engine {args.engine}, model {args.model}: {where}; load {load_s:.1f} s")
    print(
        f"{len(prompts)} prompts x up to {args.max_tokens} tokens, top_k {args.top_k}, "
        f"median of {args.repeats} interleaved repeats"
    )
    for name, value in med.items():
        spread = ", ".join(f"{1000 * v:.2f}" for v in wall[name])
        print(f"  {name:<28} {1000 * value:8.2f} ms/token wall, {1000 * med_cpu[name]:8.2f} CPU  (runs: {spread})")
    for label, figures in (("wall", med), ("CPU ", med_cpu)):
        gen_ratio = figures["gate generate"] / figures[native_name]
        force_ratio = figures["gate force"] / figures["gate generate"]
        print(
            f"{label}: gate generate / {native_name} = {gen_ratio:.3f} (goal <= 1.0); "
            f"gate force / gate generate = {force_ratio:.3f} (goal <= 1.1)"
        )
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
