"""Capture for `gate diagnose` on the vLLM engine, through a worker extension (as
gate.engines.vllm.routing records routing).

`DiagnoseCapture` extends the routing extension: in the worker's process it registers forward
hooks on the worker's model (`model.embed_tokens`, each `model.layers.N` and its norms,
`self_attn` and `mlp`, `model.norm`, and the `logits_processor` for lm_head) and keeps every
forward's rows. vLLM's fused RMSNorm returns `(normed, residual)` and its decoder layers
`(hidden, residual)` unsummed: a norm's point is the normed tensor, and a layer's residual
stream after it is the sum. Each forward's first context position is counted from the rows
of `model.embed_tokens` (one request at a time, prefix caching off, as the engine runs).

The engine's `LLM` carries this extension when it records routing (the default);
otherwise `capture_vllm` restarts it with the extension (the engine's own options
otherwise) once, and keeps it: its hooks are removed after each capture, so the model runs
untouched. It feeds the context (prefill: one request over it; decode: the prompt, then the
context's tokens forced one decode step at a time by the engine's forced-token logits
processor).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

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
    Capture,
    Point,
    Tensor,
)
from gate.engines.vllm.routing import RoutingCapture
from gate.errors import InputError

EXTENSION = "gate.engines.vllm.capture.DiagnoseCapture"
_LAYER = re.compile(r"^model\.layers\.(\d+)$")
_CHILD = re.compile(r"^model\.layers\.(\d+)\.(input_layernorm|post_attention_layernorm|self_attn|mlp)$")


def point_of(name: str, module: Any, layer_count: int) -> Point | None:
    if name == "model.embed_tokens":
        return Point(-1, EMBEDDING, name)
    if name == "model.norm":
        return Point(layer_count, FINAL_NORM, name)
    if name == "logits_processor":
        return Point(layer_count, LM_HEAD, "lm_head")
    m = _LAYER.match(name)
    if m is not None:
        return Point(int(m.group(1)), RESIDUAL, name)
    m = _CHILD.match(name)
    if m is None:
        return None
    child = m.group(2)
    if child == "self_attn":
        part = ATTENTION
    elif child == "mlp":
        part = EXPERTS if hasattr(module, "experts") else MLP
    else:
        part = NORM
    return Point(int(m.group(1)), part, name)


class DiagnoseCapture(RoutingCapture):
    """Worker extension: `gate_diag_start`, `gate_diag_take` (and the routing extension's)."""

    def gate_diag_start(self) -> int:
        import torch

        model = self.model_runner.get_model()
        config = getattr(model, "config", None)
        layer_count = int(getattr(config, "num_hidden_layers", 0))
        self._diag_rows: dict[str, list[tuple[int, Any]]] = {}
        self._diag_points: dict[str, tuple[int, str, str]] = {}
        self._diag_order: list[str] = []
        self._diag_cursor = 0
        self._diag_start = 0
        self._diag_tokens = 0
        self._diag_handles: list[Any] = []
        for name, module in model.named_modules():
            point = point_of(name, module, layer_count)
            if point is None:
                continue

            def hook(mod: Any, args: Any, output: Any, point: Point = point) -> None:
                if isinstance(output, torch.Tensor):
                    t = output
                elif point.part == RESIDUAL and isinstance(output, tuple) and len(output) == 2:
                    hidden, residual = output
                    t = hidden if residual is None else hidden + residual
                elif isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
                    t = output[0]
                else:
                    return
                rows = t.detach().reshape(-1, t.shape[-1]).float().cpu().numpy().copy()
                if point.part == EMBEDDING:  # the first point of each forward: its tokens
                    self._diag_start, self._diag_tokens = self._diag_cursor, rows.shape[0]
                    self._diag_cursor += rows.shape[0]
                k = rows.shape[0]
                if k > self._diag_tokens:
                    return
                if point.module not in self._diag_rows:
                    self._diag_order.append(point.module)
                    self._diag_rows[point.module] = []
                    self._diag_points[point.module] = (point.layer, point.part, point.module)
                self._diag_rows[point.module].append((self._diag_start + self._diag_tokens - k, rows))

            self._diag_handles.append(module.register_forward_hook(hook))
        return layer_count

    def gate_diag_take(self) -> list[tuple[tuple[int, str, str], list[int], bytes, int]]:
        """Every point's rows since the start: (point, positions, float32 bytes, width)."""
        out = []
        for module in self._diag_order:
            positions: list[int] = []
            arrays = []
            for start, rows in self._diag_rows[module]:
                positions.extend(range(start, start + rows.shape[0]))
                arrays.append(rows)
            values = np.concatenate(arrays).astype(np.float32)
            out.append((self._diag_points[module], positions, values.tobytes(), int(values.shape[1])))
        for h in self._diag_handles:
            h.remove()
        self._diag_handles = []
        return out


def capture_vllm(engine: Any, prompt_ids: Sequence[int], context_ids: Sequence[int], path: str) -> Capture:
    """The vLLM engine's capture over `context_ids` through `path` (see the module doc)."""
    if path not in PATHS:
        raise InputError(f"path {path!r}: expected prefill or decode")
    if list(context_ids[: len(prompt_ids)]) != list(prompt_ids) or not prompt_ids:
        raise InputError("the context must start with the (non-empty) prompt")
    if path != PREFILL and engine.options.get("force_mode") != "decode":
        raise InputError("gate diagnose on vllm's decode path needs --engine-opt force_mode=decode")
    llm = engine.llm if getattr(engine, "_gate_diagnose_llm", None) is engine.llm is not None else None
    running = (engine.llm_mode, engine.llm_extension) if engine.llm is not None else None
    if llm is None and running == ("raw_logprobs", EXTENSION):  # started with it: no restart
        llm = engine._gate_diagnose_llm = engine.llm
    if llm is None:  # restart the engine's LLM with the extension, once
        engine._shutdown()
        saved = (engine.worker_extension, engine.options["record_routing"])
        engine.worker_extension = EXTENSION
        engine.options["record_routing"] = True
        try:
            llm = engine._start("raw_logprobs")
        finally:
            engine.worker_extension, engine.options["record_routing"] = saved
        engine._gate_diagnose_llm = llm
    try:
        llm.collective_rpc("gate_diag_start")
        if path == PREFILL or len(context_ids) == len(prompt_ids):
            ids = list(context_ids)
            llm.generate([{"prompt_token_ids": ids}], engine._params(1, None), use_tqdm=False)
        else:
            forced = [int(t) for t in context_ids[len(prompt_ids) :]] + [0]
            params = engine._params(len(forced), None, ignore_eos=True, extra_args={engine.forced_key: forced})
            llm.generate([{"prompt_token_ids": list(prompt_ids)}], params, use_tqdm=False)
    except BaseException:
        engine._shutdown()
        raise
    taken = llm.collective_rpc("gate_diag_take")[0]
    tensors = []
    for (layer, part, module), positions, raw, width in taken:
        values = np.frombuffer(raw, dtype=np.float32).reshape(-1, width)
        keep = [i for i, p in enumerate(positions) if p < len(context_ids)]  # the forced tail's extra step
        tensors.append(
            Tensor(Point(int(layer), str(part), str(module)), tuple(positions[i] for i in keep), values[keep])
        )
    return Capture(path=path, context_length=len(context_ids), tensors=tuple(tensors), meta={"engine": "vllm"})
