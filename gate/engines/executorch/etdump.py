"""Named activations of gate's ExecuTorch program, read from its own ETDump.

The shipped `.pte` runs once over the context with ExecuTorch's ETDump and a debug buffer
(`Runtime.load_program(..., enable_etdump=True, debug_buffer_size=N)`): the runtime logs
every instruction's outputs (a portable kernel's output; a delegate call's arguments, its
inputs then its outputs) into the buffer. The ETDump names no module: an entry carries an
instruction id. The program's ETRecord, written by gate's export beside it
(`gate.engines.executorch.export`), holds the edge program before lowering, whose nodes
carry a debug handle and their `nn_module_stack`, and two maps the emitter wrote: which
debug handles each instruction runs (`debug_handle_map`) and how many outputs each delegate
call has (`instruction_id_to_num_outs_map`); `executorch.devtools.Inspector` reads the same
three. From them each logged output is a node of the graph, and a node is a module's output
by the graph's structure alone, never by its values:

- a module's output (`model.embed_tokens`, a layer's `input_layernorm`,
  `post_attention_layernorm`, `mlp`, `model.norm`, `lm_head`) is the one node inside the
  module's scope that a node outside it uses; a layer's `self_attn` is its `o_proj`'s output
  (gate's export calls the attention's projections, not the attention module);
- a layer's residual stream `model.layers.N` is the one node outside the next layer's
  `input_layernorm` (the last layer's: `model.norm`) that a node inside it uses: in the
  pre-norm decoders the export supports, the stream a layer leaves is what the next norm reads.

A delegate call's outputs are its nodes that a node outside it uses, in the order the
emitter lists the call's debug handles (the lowered module's node order, which is the order
of its outputs); a call whose nodes are shared with other instructions (an operator
decomposed after the ETRecord was taken, e.g. the attention's `scaled_dot_product_attention`)
or whose count disagrees with the emitter's is left unnamed, as is a node whose logged shape
is not its graph shape. Whatever no logged output is stays out: the XNNPACK delegates
compute most of a layer inside one call, so its attention, MLP and post-attention norm are
never logged (docs/results/engine-executorch.md, "Diagnosis").

The run happens in a child process (`python -m gate.engines.executorch.etdump ...`): a
debug buffer too small for what the runtime logs is not an error ExecuTorch 1.5.1 returns,
it aborts the process (SIGABRT), and gate's own process must survive that. The child writes
the named arrays as a safetensors file and one JSON line of facts.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
import resource
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

METHOD = "forward"
WRAPPER = "model."  # the export's wrapper holds the causal LM as `model`: HF names sit under it
ALIGN = 64  # slack per logged tensor for the buffer's alignment


# --------------------------------------------------------------------------- naming (pure)


def _paths(node: Any) -> set[str]:
    stack = node.meta.get("nn_module_stack") or {}
    return {str(v[0]) for v in stack.values() if isinstance(v, tuple | list) and v}


def _calls(graph: Any) -> list[Any]:
    return [n for n in graph.nodes if n.op == "call_function"]


def _module_output(nodes: Sequence[Any], scope: dict[Any, set[str]], path: str) -> Any | None:
    """The one node inside module `path` that a node outside it uses (None: none or several)."""
    outs = [
        n
        for n in nodes
        if path in scope[n] and any(u.op == "output" or path not in scope.get(u, set()) for u in n.users)
    ]
    return outs[0] if len(outs) == 1 else None


def _module_input(nodes: Sequence[Any], scope: dict[Any, set[str]], path: str) -> Any | None:
    """The one computed node outside module `path` that a node inside it uses."""
    ins = {
        a
        for n in nodes
        if path in scope[n]
        for a in n.all_input_nodes
        if a.op == "call_function" and path not in scope[a]
    }
    return next(iter(ins)) if len(ins) == 1 else None


def named_nodes(graph: Any, names: Iterable[str]) -> dict[str, Any]:
    """Each of `names` (HF module names) that the graph's structure names -> its node."""
    nodes = _calls(graph)
    scope = {n: _paths(n) for n in nodes}
    known = set().union(*scope.values()) if scope else set()
    out: dict[str, Any] = {}
    for name in names:
        node = None
        parts = name.split(".")
        if len(parts) == 3 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
            after = f"{WRAPPER}model.layers.{int(parts[2]) + 1}.input_layernorm"
            if after not in known:
                after = f"{WRAPPER}model.norm"
            if after in known and f"{WRAPPER}{name}.input_layernorm" in known:
                node = _module_input(nodes, scope, after)
        else:
            path = f"{WRAPPER}{name}.o_proj" if name.endswith(".self_attn") else f"{WRAPPER}{name}"
            if path in known:
                node = _module_output(nodes, scope, path)
        if node is not None:
            out[name] = node
    return out


def instruction_outputs(
    graph: Any, handle_map: Mapping[str, Any], outs_map: Mapping[str, Any]
) -> dict[Any, tuple[int, int, int]]:
    """Each node some instruction outputs -> (instruction id, output index, that
    instruction's output count), from the ETRecord's maps (see the module doc)."""
    by_handle: dict[int, list[Any]] = {}  # a decomposed operator's nodes share its handle
    for node in _calls(graph):
        if node.meta.get("debug_handle") is not None:
            by_handle.setdefault(int(node.meta["debug_handle"]), []).append(node)
    handles: dict[int, list[int]] = {}
    for key, value in handle_map.items():
        handles[int(key)] = [int(h) for h in (value if isinstance(value, list) else [value])]
    owners: dict[int, set[int]] = {}
    for instruction, hs in handles.items():
        for h in hs:
            owners.setdefault(h, set()).add(instruction)
    out: dict[Any, tuple[int, int, int]] = {}
    for instruction, hs in handles.items():
        if any(len(owners[h]) > 1 for h in hs) or any(h not in by_handle for h in hs):
            continue  # a node decomposed across instructions: which output is which is unknown
        inside = [node for h in dict.fromkeys(hs) for node in by_handle[h]]
        members = set(inside)
        results = [n for n in inside if any(u.op == "output" or u not in members for u in n.users)]
        count = int(outs_map.get(str(instruction), 1))
        if len(results) != count:
            continue
        for i, node in enumerate(results):
            out[node] = (instruction, i, count)
    return out


def shape_at(node: Any, n: int) -> tuple[int, ...] | None:
    """The node's output shape with the program's dynamic sequence length at `n`."""
    val = node.meta.get("val")
    sizes = getattr(val, "shape", None)
    if sizes is None:
        return None
    dims = []
    for s in sizes:
        expr = getattr(getattr(s, "node", None), "expr", None)
        if expr is None:
            dims.append(int(s))
        else:
            dims.append(int(expr.subs({sym: n for sym in expr.free_symbols})))
    return tuple(dims)


def buffer_estimate(graph: Any, n: int) -> int:
    """Bytes of debug buffer a run over `n` tokens is likely to need: every computed value
    logged once as an output and once more per use (a delegate logs its inputs too). Values
    computed by operators decomposed after the ETRecord was taken are not in the graph: the
    caller retries with a larger buffer when the runtime runs out."""
    total = 0
    for node in graph.nodes:
        if node.op not in ("call_function", "placeholder"):
            continue
        shape = shape_at(node, n)
        val = node.meta.get("val")
        size = getattr(val, "element_size", None)
        if shape is None or size is None:
            continue
        logged = (1 if node.op == "call_function" else 0) + len(node.users)
        total += (int(np.prod(shape, dtype=np.int64)) * int(size()) + ALIGN) * logged
    return total


# --------------------------------------------------------------------------- the run (child)


def _logged(etdump: bytes) -> dict[int, list[tuple[tuple[int, ...], str, int]]]:
    """Instruction id -> its logged tensors (shape, scalar type, offset in the buffer), in order."""
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    dump = deserialize_from_etdump_flatcc(etdump)
    out: dict[int, list[tuple[tuple[int, ...], str, int]]] = {}
    for run in dump.run_data or ():
        for event in run.events or ():
            debug_event = getattr(event, "debug_event", None)
            if debug_event is None or getattr(debug_event, "delegate_debug_id_int", None) not in (None, -1):
                continue
            tensor = getattr(getattr(debug_event, "debug_entry", None), "tensor", None)
            if tensor is None:
                out.setdefault(int(debug_event.instruction_id), []).append(((), "", -1))
                continue
            shape = tuple(int(s) for s in tensor.sizes)
            out.setdefault(int(debug_event.instruction_id), []).append(
                (shape, str(tensor.scalar_type.name), int(tensor.offset))
            )
    return out


@contextlib.contextmanager
def _mapped(fh: Any) -> Iterator[Any]:
    """The file's bytes, mapped read-only (empty bytes for an empty file)."""
    if os.fstat(fh.fileno()).st_size == 0:
        yield b""
        return
    with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        yield mapped


def capture(
    pte: Path, etrecord: Path, ids: Sequence[int], names: Sequence[str], buffer_bytes: int | None
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Run the program over `ids` (one forward from position 0) with an ETDump; the arrays
    named by the ETRecord ([positions, width] float32), and facts about the run."""
    import torch
    from executorch.devtools.etrecord import parse_etrecord
    from executorch.runtime import Runtime, Verification

    # ExecuTorch's LLM operators (`llama.custom_sdpa`, ...), as the engine registers them: a
    # program built with them needs their kernels, and its ETRecord their schemas.
    with contextlib.suppress(ImportError, OSError, AssertionError):
        from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401

    record = parse_etrecord(str(etrecord))
    edge = record.edge_dialect_program
    program_ep = edge[METHOD] if isinstance(edge, dict) else edge
    graph = program_ep.graph_module.graph
    n = len(ids)
    size = buffer_bytes if buffer_bytes is not None else buffer_estimate(graph, n)
    print(f"debug buffer: {size} bytes", file=sys.stderr, flush=True)
    wanted = named_nodes(graph, names)
    where = instruction_outputs(
        graph,
        (record._debug_handle_map or {}).get(METHOD, {}),
        (record._instruction_id_to_num_outs_map or {}).get(METHOD, {}),
    )
    # name -> (instruction, output index, output count, shape): plain data, so the ETRecord's
    # programs (a copy of the weights) are freed before the run
    plan = {name: (*where[node], shape_at(node, n)) for name, node in wanted.items() if node in where}
    named_in_graph = len(wanted)
    del record, edge, program_ep, graph, wanted, where
    gc.collect()
    program = Runtime.get().load_program(
        str(pte), verification=Verification.Minimal, enable_etdump=True, debug_buffer_size=size
    )
    method = program.load_method(METHOD)
    method.execute([torch.tensor([list(ids)], dtype=torch.long), torch.arange(n, dtype=torch.long)])
    arrays: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        etdump_file, debug_file = Path(tmp) / "run.etdp", Path(tmp) / "debug.bin"
        program.write_etdump_result_to_file(str(etdump_file), str(debug_file))
        del method, program  # the runtime's debug buffer
        logged = _logged(etdump_file.read_bytes())
        with open(debug_file, "rb") as fh, _mapped(fh) as buf:  # read only the named tensors' pages
            for name, (instruction, index, count, want) in plan.items():
                entries = logged.get(instruction, [])
                if len(entries) < count:
                    continue
                shape, dtype, offset = entries[len(entries) - count + index]
                if dtype != "FLOAT" or shape != want or len(shape) < 2 or shape[-2] != n:
                    continue
                total = int(np.prod(shape, dtype=np.int64))
                if offset < 0 or offset + 4 * total > len(buf):
                    continue
                values = np.array(np.frombuffer(buf, dtype="<f4", count=total, offset=offset), dtype=np.float32)
                arrays[name] = values.reshape(n, shape[-1])
    ends = (o + 4 * int(np.prod(s, dtype=np.int64)) for es in logged.values() for s, _, o in es if o >= 0)
    used = max(ends, default=0)
    facts = {
        "buffer_bytes": size,
        "buffer_used_bytes": used,
        "instructions_logged": len(logged),
        "named": len(arrays),
        "named_in_graph": named_in_graph,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    return arrays, facts


def main(argv: list[str]) -> int:
    """`python -m gate.engines.executorch.etdump PTE ETRECORD REQUEST.json OUT.safetensors`:
    REQUEST holds `token_ids`, `names` and `buffer_bytes` (null: estimated)."""
    import orjson

    from gate.core.diagnosis.dump import write_safetensors

    pte, etrecord, request, out = (Path(a) for a in argv)
    asked = orjson.loads(request.read_bytes())
    arrays, facts = capture(pte, etrecord, asked["token_ids"], asked["names"], asked.get("buffer_bytes"))
    out.write_bytes(write_safetensors(arrays, {}))
    sys.stdout.write(orjson.dumps(facts).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
