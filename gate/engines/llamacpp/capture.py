"""Capture for `gate diagnose` on the llama.cpp engine, through ggml's eval callback.

llama-cpp-python exposes llama.cpp's `cb_eval` context parameter (a
`ggml_backend_sched_eval_callback`): the scheduler asks it, node by node, whether it wants a
tensor (`ask` true), then calls it again once that tensor is computed. A second context on
the engine's own model, with the engine's own context parameters plus the callback, stands
in for the engine's context while the engine's own `_reset` and `_decode` feed the context
(one call over it: prefill; the prompt, then one call per token: decode), so the kernels
and batch sizes are the engine's.

llama.cpp's graph names (`cb(cur, "attn_out", il)` in its model builders) map to the
transformers modules of a Llama-style model:

    embd (inp_embd)     model.embed_tokens                  embedding  (layer -1)
    attn_norm-N         model.layers.N.input_layernorm      norm
    attn_out-N          model.layers.N.self_attn            attention  (after the output projection)
    ffn_norm-N          model.layers.N.post_attention_layernorm  norm
    ffn_moe_logits-N    model.layers.N.mlp.gate             router     (MoE)
    ffn_out-N           model.layers.N.mlp                  mlp, or experts on an MoE layer
    l_out-N             model.layers.N                      residual
    result_norm         model.norm                          final_norm
    result_output       lm_head                             lm_head

The last layer of a llama.cpp graph keeps only the rows that ask for logits after its
attention (`inp_out_ids`), so its later points, the final norm and lm_head hold the last
position of each call; the comparison uses the positions both captures have.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Sequence
from typing import Any

import llama_cpp
import llama_cpp._ggml
import numpy as np
from llama_cpp import _internals

from gate.core.diagnosis.capture import (
    ATTENTION,
    EMBEDDING,
    EXPERTS,
    FINAL_NORM,
    LM_HEAD,
    MLP,
    NORM,
    PATHS,
    PREFILL,
    RESIDUAL,
    ROUTER,
    Capture,
    Point,
    Tensor,
    stack_rows,
)
from gate.errors import EngineError, InputError

GGML_TYPE_F32 = 0
_NAMED = re.compile(r"^(attn_norm|attn_out|ffn_norm|ffn_moe_logits|ffn_out|l_out)-(\d+)$")
_GLOBAL = {"embd": (EMBEDDING, "model.embed_tokens"), "inp_embd": (EMBEDDING, "model.embed_tokens")}
_FINAL = {"result_norm": (FINAL_NORM, "model.norm"), "result_output": (LM_HEAD, "lm_head")}


class _TensorPrefix(ctypes.Structure):
    """The first fields of ggml.h's `struct ggml_tensor` (type, buffer, ne[4], nb[4]), stable
    across ggml versions; everything else is read through ggml's functions."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
    ]


def _ggml() -> Any:
    lib = llama_cpp._ggml.libggml
    lib.ggml_get_name.restype = ctypes.c_char_p
    lib.ggml_get_name.argtypes = [ctypes.c_void_p]
    lib.ggml_nbytes.restype = ctypes.c_size_t
    lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
    lib.ggml_is_contiguous.restype = ctypes.c_bool
    lib.ggml_is_contiguous.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_tensor_get.restype = None
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    return lib


def point_of(name: str, layer_count: int, moe_layers: set[int]) -> Point | None:
    """The transformers point a llama.cpp graph tensor stands for, or None."""
    if name in _GLOBAL:
        part, module = _GLOBAL[name]
        return Point(-1, part, module)
    if name in _FINAL:
        part, module = _FINAL[name]
        return Point(layer_count, part, module)
    m = _NAMED.match(name)
    if m is None:
        return None
    kind, layer = m.group(1), int(m.group(2))
    prefix = f"model.layers.{layer}"
    table = {
        "attn_norm": (NORM, f"{prefix}.input_layernorm"),
        "attn_out": (ATTENTION, f"{prefix}.self_attn"),
        "ffn_norm": (NORM, f"{prefix}.post_attention_layernorm"),
        "ffn_moe_logits": (ROUTER, f"{prefix}.mlp.gate"),
        "ffn_out": (EXPERTS if layer in moe_layers else MLP, f"{prefix}.mlp"),
        "l_out": (RESIDUAL, prefix),
    }
    part, module = table[kind]
    return Point(layer, part, module)


class _Recorder:
    def __init__(self, layer_count: int) -> None:
        self.lib = _ggml()
        self.layer_count = layer_count
        self.moe_layers: set[int] = set()
        self.graph_start = 0
        self.graph_tokens = 0
        self.cursor = 0  # the context position of the next graph's first token
        self.order: list[str] = []
        self.points: dict[str, Point] = {}
        self.rows: dict[str, list[tuple[int, np.ndarray]]] = {}
        self.skipped: set[str] = set()
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._cb)

    def _cb(self, t: int, ask: bool, user_data: Any) -> bool:
        name = (self.lib.ggml_get_name(t) or b"").decode("utf-8", "replace")
        if name.startswith("ffn_moe_logits-"):
            self.moe_layers.add(int(name.rsplit("-", 1)[1]))
        point = point_of(name, self.layer_count, self.moe_layers)
        if ask:
            return point is not None
        if point is None:
            return True
        head = _TensorPrefix.from_address(t)
        if name in _GLOBAL:  # the first node of each graph: its tokens start at the cursor
            self.graph_start, self.graph_tokens = self.cursor, int(head.ne[1])
            self.cursor += self.graph_tokens
        if head.type != GGML_TYPE_F32 or not self.lib.ggml_is_contiguous(t) or head.ne[2] != 1 or head.ne[3] != 1:
            self.skipped.add(name)
            return True
        width, k = int(head.ne[0]), int(head.ne[1])
        buf = np.empty((k, width), dtype=np.float32)
        self.lib.ggml_backend_tensor_get(t, buf.ctypes.data, 0, self.lib.ggml_nbytes(t))
        module = point.module
        if module not in self.rows:
            self.order.append(module)
            self.rows[module] = []
        self.points[module] = point
        self.rows[module].append((self.graph_start + self.graph_tokens - k, buf))
        return True


def capture_llamacpp(engine: Any, prompt_ids: Sequence[int], context_ids: Sequence[int], path: str) -> Capture:
    """The llama.cpp engine's capture over `context_ids` through `path` (see the module doc)."""
    if path not in PATHS:
        raise InputError(f"path {path!r}: expected prefill or decode")
    if list(context_ids[: len(prompt_ids)]) != list(prompt_ids) or not prompt_ids:
        raise InputError("the context must start with the (non-empty) prompt")
    layer_count = int(llama_cpp.llama_model_n_layer(engine.model.model))
    rec = _Recorder(layer_count)
    params = type(engine.context_params).from_buffer_copy(engine.context_params)
    params.cb_eval = rec.callback
    params.cb_eval_user_data = None
    try:
        ctx = _internals.LlamaContext(model=engine.model, params=params, verbose=False)
    except (ValueError, RuntimeError) as exc:
        raise EngineError(f"llama.cpp cannot create a capture context: {exc}") from None
    own = engine.ctx
    engine.ctx = ctx
    try:
        engine._reset()
        if path == PREFILL:
            engine._decode(list(context_ids), 0)
        else:
            engine._decode(list(prompt_ids), 0)
            for i in range(len(prompt_ids), len(context_ids)):
                engine._decode([int(context_ids[i])], i)
    finally:
        engine.ctx = own
        ctx.close()
    tensors = []
    for module in rec.order:
        positions, values = stack_rows(rec.rows[module])
        tensors.append(Tensor(rec.points[module], positions, values))
    meta = {"engine": "llamacpp", "skipped_tensors": sorted(rec.skipped)}
    return Capture(path=path, context_length=len(context_ids), tensors=tuple(tensors), meta=meta)
