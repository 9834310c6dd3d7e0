"""Export a Hugging Face decoder-only checkpoint to an ExecuTorch program (`.pte`) with a KV cache.

The model is wrapped with a static-shaped KV cache whose buffers are updated in place at
the given cache positions (`gate.engines.executorch.kv_cache`), so the program's
`forward(input_ids [1, seq], cache_position [seq]) -> logits [1, seq, vocab]` keeps its
cache between calls, the signature of Hugging Face's ExecuTorch integration (and
optimum-executorch). (transformers' own `TorchExportableModuleWithStaticCache` exports
under torch 2.13 but its graph fails ExecuTorch's decomposition step: "expected
compiled_fn to be GraphModule".) It is exported with
`torch.export` with a dynamic sequence length (one call prefills a whole prompt, then one
call per new token), lowered to XNNPACK with `XnnpackPartitioner`
(`to_edge_transform_and_lower`), and serialised with `to_executorch()`.

Recipes:
- `fp32`: the checkpoint's weights widened to float32, float32 arithmetic.
- `8da4w`: torchao's 8-bit dynamic activation, 4-bit weight quantisation of every linear
  layer (lm_head included), symmetric int4 weights in groups of `GROUP_SIZE` along the input
  dimension, activations quantised per token to int8 at run time: the recipe ExecuTorch's
  Llama example ships for XNNPACK (`-qmode 8da4w`). Embeddings stay float32.

Attention (`ATTENTIONS`): `masked` (the default) writes the cache with `index_put` and
attends over all `max_seq_len` rows with a causal mask row (`StaticCacheDecoder`);
`custom_sdpa` uses ExecuTorch's own LLM operators `llama.update_cache` and
`llama.custom_sdpa` (`CustomOpsDecoder`), which attend only to the rows written so far. The
two are the same computation in float32 (on the tiny test Llama their logits agree to
about 1e-5); the program of the second needs those operators' kernels in the runtime
(`executorch.extension.llm.custom_ops`, which the engine imports).

The export also writes an ETRecord beside the program (`ETRECORD_NAME`, ExecuTorch's
`to_edge_transform_and_lower(..., generate_etrecord=True)`, then the program manager's
`get_etrecord().save(...)`): the edge program before lowering (each node's debug handle and
`nn_module_stack`), which instructions run which nodes (`debug_handle_map`) and how many
outputs each instruction has. It changes nothing the program computes (the tiny test Llama's
`.pte` is byte-identical with and without it); `gate diagnose` reads it to name the tensors
the program's ETDump logs (`gate.engines.executorch.etdump`). The ATen program ExecuTorch
also puts in it is left out: nothing gate reads needs it, and it is a second copy of the
weights.

The program also carries the constant methods ExecuTorch's LLM runner reads
(`get_max_seq_len`, `get_vocab_size`, `use_kv_cache`, `get_eos_ids`, ...), so gate can run
a `.pte` it did not build.

Run as `python -m gate.engines.executorch.export SOURCE OUT.pte RECIPE MAX_SEQ_LEN [ATTENTION]` (gate's
cache does, in a child process: an export takes minutes and gigabytes, and a crash there
must not take gate with it). Prints one JSON line of facts about the export on success.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

RECIPES = ("fp32", "8da4w")
ATTENTIONS = ("masked", "custom_sdpa")
# 576, the default model's hidden size, is a multiple of 32 but not of 128.
GROUP_SIZE = 32
BACKEND = "XNNPACK"
ETRECORD_NAME = "etrecord.bin"
EXAMPLE_PREFILL = 4  # the example sequence length torch.export traces with (the dim stays dynamic)


def export_pte(source: Path, out: Path, recipe: str, max_seq_len: int, attention: str = "masked") -> dict[str, Any]:
    """Export `source` (a Hugging Face folder) to the ExecuTorch program `out`; facts about it."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.passes.sym_shape_eval_pass import ConstraintBasedSymShapeEvalPass
    from transformers import AutoModelForCausalLM

    from gate.engines.executorch.kv_cache import CustomOpsDecoder, StaticCacheDecoder

    if recipe not in RECIPES:
        raise ValueError(f"recipe {recipe!r}: expected one of {', '.join(RECIPES)}")
    if attention not in ATTENTIONS:
        raise ValueError(f"attention {attention!r}: expected one of {', '.join(ATTENTIONS)}")
    if attention == "custom_sdpa":
        from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  (registers llama.*)
    started = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(
        str(source), dtype=torch.float32, attn_implementation="sdpa", local_files_only=True
    ).eval()
    config = model.config
    if recipe == "8da4w":
        _quantize_8da4w(model)
    decoder = CustomOpsDecoder if attention == "custom_sdpa" else StaticCacheDecoder
    wrapped = decoder(model, max_seq_len).eval()
    seq = torch.export.Dim("seq", min=1, max=max_seq_len)
    ids = torch.zeros((1, EXAMPLE_PREFILL), dtype=torch.long)
    pos = torch.arange(EXAMPLE_PREFILL, dtype=torch.long)
    with torch.no_grad():
        program = torch.export.export(wrapped, args=(ids, pos), dynamic_shapes=({1: seq}, {0: seq}), strict=False)
    exported_s = time.monotonic() - started
    eos = model.generation_config.eos_token_id
    eos_ids = [int(eos)] if isinstance(eos, int) else [int(t) for t in eos or ()]
    constants = {
        "get_max_seq_len": max_seq_len,
        "get_max_context_len": max_seq_len,
        "get_vocab_size": int(config.vocab_size),
        "get_max_batch_size": 1,
        "use_kv_cache": True,
        "use_sdpa_with_kv_cache": False,
        "enable_dynamic_shape": True,
        "get_bos_id": int(config.bos_token_id) if isinstance(config.bos_token_id, int) else 0,
        "get_eos_ids": eos_ids,
    }
    edge = to_edge_transform_and_lower(
        program,
        partitioner=[XnnpackPartitioner()],
        compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True),
        constant_methods=constants,
        generate_etrecord=True,
    )
    delegated = _delegation(edge)
    et_program = edge.to_executorch(
        ExecutorchBackendConfig(
            extract_delegate_segments=True,
            memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False),
            sym_shape_eval_pass=ConstraintBasedSymShapeEvalPass(),
        )
    )
    out.write_bytes(et_program.buffer)
    etrecord = et_program.get_etrecord()
    etrecord.exported_program = None  # the ATen program: a second copy of the weights, never read
    etrecord.save(str(out.with_name(ETRECORD_NAME)))
    return {
        "recipe": recipe,
        "attention": attention,
        "max_seq_len": max_seq_len,
        "vocab_size": int(config.vocab_size),
        "eos_ids": eos_ids,
        "backend": BACKEND,
        "group_size": GROUP_SIZE if recipe == "8da4w" else None,
        "delegated_ops": delegated,
        "etrecord": ETRECORD_NAME,
        "export_seconds": round(exported_s, 1),
        "total_seconds": round(time.monotonic() - started, 1),
    }


def _quantize_8da4w(model: Any) -> None:
    """Every nn.Linear to int8 dynamic activations x int4 grouped weights (torchao), as
    ExecuTorch's Llama export does for `-qmode 8da4w`."""
    import torch
    from torchao.quantization import quantize_

    try:
        from torchao.quantization import Int8DynamicActivationIntxWeightConfig
        from torchao.quantization.granularity import PerGroup

        config: Any = Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4,  # type: ignore[attr-defined]
            weight_granularity=PerGroup(GROUP_SIZE),
        )
    except ImportError:  # an older torchao
        from torchao.quantization import Int8DynamicActivationInt4WeightConfig

        config = Int8DynamicActivationInt4WeightConfig(group_size=GROUP_SIZE)
    # A tied lm_head shares the embedding's Parameter; quantising it must not touch the
    # embedding, so it gets a weight of its own first.
    head = model.get_output_embeddings()
    if head is not None and head.weight is model.get_input_embeddings().weight:
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
    quantize_(model, config)


def _delegation(edge: Any) -> dict[str, int]:
    """How many calls of the lowered graph went to a backend, and how many stayed portable."""
    graph = edge.exported_program().graph_module.graph
    delegated = portable = 0
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target))
        if "executorch_call_delegate" in name:
            delegated += 1
        elif name not in ("getitem",):
            portable += 1
    return {"delegate_calls": delegated, "portable_ops": portable}


def main(argv: list[str]) -> int:
    import orjson

    if len(argv) not in (4, 5):
        print(
            "usage: python -m gate.engines.executorch.export SOURCE OUT.pte RECIPE MAX_SEQ_LEN [ATTENTION]",
            file=sys.stderr,
        )
        return 2
    source, out, recipe, max_seq_len = Path(argv[0]), Path(argv[1]), argv[2], int(argv[3])
    facts = export_pte(source, out, recipe, max_seq_len, argv[4] if len(argv) == 5 else "masked")
    sys.stdout.write(orjson.dumps(facts).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
