"""Which of `gate diagnose`'s module outputs an ExecuTorch program's own ETDump holds.

Runs a `.pte` (gate's KV-cache export: `forward(input_ids [1, seq], cache_position [seq])`)
once over a context from position 0 in ExecuTorch's Python runtime with ETDump and a debug
buffer (`Runtime.load_program(..., enable_etdump=True, debug_buffer_size=N)`,
`write_etdump_result_to_file`), reads every float tensor the runtime logged (the output of
each instruction: each portable kernel call and each XNNPACK delegate call), and looks for each
module output of the source checkpoint in transformers float32 (forward hooks, the names
`gate diagnose` compares) among them: found (the closest logged tensor of that size, its
relative L2 error, the instruction) or not found. The ETDump names no module: a logged
tensor carries an instruction id, not a module name; this script matches by value only to
show what the program exposes.

    OMP_NUM_THREADS=1 python scripts/executorch_etdump.py PROGRAM.pte SOURCE_FOLDER [--text T] [--tokens N]

Prints one line per module and a summary; docs/results/engine-executorch.md quotes it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

SIZES = {"FLOAT": 4}


def logged_outputs(pte: Path, ids: list[int], buffer_bytes: int) -> list[tuple[int, tuple[int, ...], np.ndarray]]:
    """(instruction id, shape, float32 values) of every float tensor the ETDump logged."""
    import torch
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc
    from executorch.runtime import Runtime, Verification

    program = Runtime.get().load_program(
        str(pte), verification=Verification.Minimal, enable_etdump=True, debug_buffer_size=buffer_bytes
    )
    method = program.load_method("forward")
    method.execute([torch.tensor([ids], dtype=torch.long), torch.arange(len(ids), dtype=torch.long)])
    with tempfile.TemporaryDirectory() as tmp:
        etdump, debug = Path(tmp) / "run.etdp", Path(tmp) / "debug.bin"
        program.write_etdump_result_to_file(str(etdump), str(debug))
        dump = deserialize_from_etdump_flatcc(etdump.read_bytes())
        buf = debug.read_bytes()
    out = []
    for run in dump.run_data:
        for event in run.events:
            entry = getattr(event.debug_event, "debug_entry", None)
            tensor = getattr(entry, "tensor", None)
            if tensor is None or tensor.scalar_type.name != "FLOAT":
                continue
            shape = tuple(int(s) for s in tensor.sizes)
            count = int(np.prod(shape)) if shape else 1
            if tensor.offset + 4 * count > len(buf):
                continue  # past the debug buffer: not logged
            values = np.frombuffer(buf, dtype="<f4", count=count, offset=tensor.offset)
            out.append((int(event.debug_event.instruction_id), shape, values))
    return out


def module_outputs(source: Path, ids: list[int]) -> dict[str, np.ndarray]:
    """transformers float32's output of each module `gate diagnose` compares, flattened."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32, local_files_only=True).eval()
    seen: dict[str, np.ndarray] = {}

    def hook(name: str) -> Any:
        def keep(module: Any, args: Any, output: Any) -> None:
            t = output[0] if isinstance(output, tuple) else output
            seen[name] = t.detach().float().numpy().reshape(-1)

        return keep

    for name, module in model.named_modules():
        depth = name.count(".")
        if name in ("model.embed_tokens", "model.norm", "lm_head") or (
            name.startswith("model.layers.") and depth in (2, 3)
        ):
            if depth == 3 and name.rsplit(".", 1)[1] not in (
                "self_attn",
                "mlp",
                "input_layernorm",
                "post_attention_layernorm",
            ):
                continue
            module.register_forward_hook(hook(name))
    with torch.no_grad():
        model(torch.tensor([ids]))
    return seen


def reachability(
    logged: list[tuple[int, tuple[int, ...], np.ndarray]], reference: dict[str, np.ndarray], tolerance: float
) -> dict[str, tuple[bool, float | None, int | None]]:
    """Each module -> (found, the closest logged tensor's relative L2 error, its instruction)."""
    out: dict[str, tuple[bool, float | None, int | None]] = {}
    for name, want in reference.items():
        norm = float(np.linalg.norm(want)) or 1.0
        best: tuple[float, int] | None = None
        for instruction, _, values in logged:
            if values.size == want.size:
                err = float(np.linalg.norm(values - want)) / norm
                if best is None or err < best[0]:
                    best = (err, instruction)
        out[name] = (best is not None and best[0] <= tolerance, *(best or (None, None)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pte", type=Path)
    parser.add_argument("source", type=Path, help="the Hugging Face folder the program was exported from")
    parser.add_argument("--text", default="Write a haiku about the sea.")
    parser.add_argument("--tokens", type=int, default=24, help="context tokens (the text's, cut or repeated)")
    parser.add_argument("--buffer-mb", type=int, default=512, help="the debug buffer's size")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="relative L2 error that counts as found")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.source), local_files_only=True)
    ids = list(tok(args.text)["input_ids"])
    ids = (ids * (args.tokens // max(len(ids), 1) + 1))[: args.tokens]
    logged = logged_outputs(args.pte, ids, args.buffer_mb << 20)
    print(f"{args.pte}: {len(logged)} float tensors logged by {len({i for i, _, _ in logged})} instructions")
    found = reachability(logged, module_outputs(args.source, ids), args.tolerance)
    for name, (hit, err, instruction) in found.items():
        if hit:
            print(f"{name}: found (instruction {instruction}, relative error {err:.1e})")
        else:
            closest = f"closest relative error {err:.1e}" if err is not None else "no tensor of its size"
            print(f"{name}: not found ({closest})")
    print(f"{sum(hit for hit, _, _ in found.values())}/{len(found)} module outputs found among the logged tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
