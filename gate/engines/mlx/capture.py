"""Capture for `gate diagnose` on the MLX engine: the engine's own mlx-lm model, run as the
engine runs it, with every module gate compares read as it computes.

Each module gate reads (the input embedding; in each decoder layer every direct child that
is a norm, the attention or the MLP, and the layer itself, whose output is the residual
stream after it; the final norm; and the model's output, the logits, as `lm_head`) is
shadowed for the capture's duration by a recorder: an instance attribute that calls the
module and keeps its output, so the arithmetic is MLX's own (bfloat16 on CPU for the
default model), unchanged, and a subclass's change to a module is what is read. The
outputs are widened to float32 exactly (a bfloat16 value is a float32's upper half).

Module names are mlx-lm's, which follow transformers' (`model.layers.9.self_attn`), so they
are the names the reference's capture has; a module the reference lacks is never compared.

Paths (gate.core.diagnosis.capture): `prefill` is one forward over the context through a
fresh KV cache (the engine's `force_mode=prefill`); `decode` is the engine's own prefill of
the prompt (mlx-lm's chunks of `prefill_step_size`, then the last prompt token alone) and one
step per context token after it through the KV cache, as its `force` runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generation_stream
from mlx_lm.models.cache import make_prompt_cache

from gate.core.diagnosis.capture import (
    EMBEDDING,
    FINAL_NORM,
    LM_HEAD,
    PATHS,
    PREFILL,
    RESIDUAL,
    Capture,
    Point,
    Tensor,
    part_of,
    stack_rows,
)
from gate.errors import EngineError, InputError


class Recorder:
    """Rows of every capture point over the forwards of one capture: `begin(start, n)` before
    a forward over n tokens that are context positions start..start+n-1."""

    def __init__(self) -> None:
        self.start = 0
        self.tokens = 0
        self.order: list[Point] = []
        self.pending: list[tuple[Point, int, Any]] = []
        self.rows: dict[Point, list[tuple[int, np.ndarray]]] = {}

    def begin(self, start: int, tokens: int) -> None:
        self.start, self.tokens = start, tokens

    def keep(self, point: Point, output: Any) -> None:
        if not isinstance(output, mx.array) or output.ndim == 0:
            return
        flat = output.reshape(-1, output.shape[-1])
        k = int(flat.shape[0])
        if k > self.tokens:  # a module called over more rows than tokens: not per position
            return
        self.pending.append((point, self.start + self.tokens - k, flat))

    def flush(self) -> None:
        """Evaluate this forward's outputs and keep them as float32 numpy rows."""
        if not self.pending:
            return
        mx.eval([a for _, _, a in self.pending])
        for point, start, array in self.pending:
            if point not in self.rows:
                self.order.append(point)
                self.rows[point] = []
            self.rows[point].append((start, np.array(array.astype(mx.float32), dtype=np.float32)))
        self.pending = []

    def capture(self, path: str, context_length: int) -> Capture:
        tensors = []
        for point in self.order:
            positions, values = stack_rows(self.rows[point])
            tensors.append(Tensor(point, positions, values))
        return Capture(path=path, context_length=context_length, tensors=tuple(tensors))


class _Shadow:
    """Stands in for a module during a capture: calls it, keeps its output, and passes every
    other attribute (`as_linear`, `layers`, ...) through to it."""

    def __init__(self, module: Any, point: Point, recorder: Recorder) -> None:
        self._module, self._point, self._recorder = module, point, recorder

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._module(*args, **kwargs)
        self._recorder.keep(self._point, out[0] if isinstance(out, tuple) else out)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def _inner(model: Any) -> tuple[Any, str]:
    """The decoder stack (the object with `layers`) and its name's prefix."""
    for name in ("model", "language_model"):
        inner = getattr(model, name, None)
        if inner is not None and isinstance(getattr(inner, "layers", None), list):
            return inner, f"{name}."
    if isinstance(getattr(model, "layers", None), list):
        return model, ""
    raise EngineError(f"MLX model {type(model).__name__}: no decoder layers found (no `model.layers`)")


class Shadows:
    """Every capture point of one mlx-lm model shadowed by a recorder, until `remove()`."""

    def __init__(self, model: Any, recorder: Recorder) -> None:
        import mlx.nn as nn

        self.undo: list[Callable[[], None]] = []
        inner, prefix = _inner(model)
        layers = inner.layers
        try:
            if isinstance(getattr(inner, "embed_tokens", None), nn.Module):
                self._attr(inner, "embed_tokens", Point(-1, EMBEDDING, f"{prefix}embed_tokens"), recorder)
            for i, layer in enumerate(list(layers)):
                name = f"{prefix}layers.{i}"
                for child, module in layer.children().items():
                    part = part_of(child, module, ("experts", "switch_mlp")) if isinstance(module, nn.Module) else None
                    if part is not None:
                        self._attr(layer, child, Point(i, part, f"{name}.{child}"), recorder)
                layers[i] = _Shadow(layer, Point(i, RESIDUAL, name), recorder)
                self.undo.append(partial(layers.__setitem__, i, layer))
            if isinstance(getattr(inner, "norm", None), nn.Module):
                self._attr(inner, "norm", Point(len(layers), FINAL_NORM, f"{prefix}norm"), recorder)
        except BaseException:
            self.remove()
            raise

    def _attr(self, owner: Any, key: str, point: Point, recorder: Recorder) -> None:
        # An instance attribute shadows the module's entry in its owner's dict (an MLX Module
        # is a dict): the parameters stay where they are, and deleting it restores the module.
        object.__setattr__(owner, key, _Shadow(getattr(owner, key), point, recorder))
        self.undo.append(lambda: object.__delattr__(owner, key))

    def remove(self) -> None:
        while self.undo:
            self.undo.pop()()


class _Head:
    """The engine's model during a capture: each call is a forward over the next context
    positions; its output, the logits, is kept as `lm_head`."""

    def __init__(self, model: Any, recorder: Recorder, layer_count: int) -> None:
        self._model, self._recorder = model, recorder
        self._point = Point(layer_count, LM_HEAD, "lm_head")
        self.position = 0

    def __call__(self, tokens: Any, *args: Any, **kwargs: Any) -> Any:
        n = int(tokens.shape[-1])
        self._recorder.begin(self.position, n)
        out = self._model(tokens, *args, **kwargs)
        self._recorder.keep(self._point, out)
        self._recorder.flush()
        self.position += n
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def capture_mlx(engine: Any, prompt_ids: Sequence[int], context_ids: Sequence[int], path: str) -> Capture:
    """The MLX engine's capture over `context_ids` (which starts with `prompt_ids`) through `path`."""
    if path not in PATHS:
        raise InputError(f"path {path!r}: expected prefill or decode")
    if list(context_ids[: len(prompt_ids)]) != list(prompt_ids) or not prompt_ids:
        raise InputError("the context must start with the (non-empty) prompt")
    model = engine.model
    if model is None:
        raise EngineError("the MLX engine is closed")
    recorder = Recorder()
    shadows = Shadows(model, recorder)
    head = _Head(model, recorder, len(_inner(model)[0].layers))
    held = engine._cache
    engine._cache = None  # a fresh KV cache: every context position is computed
    engine.model = head
    try:
        with mx.stream(generation_stream):
            if path == PREFILL:
                head(mx.array([int(t) for t in context_ids], dtype=mx.uint32)[None], cache=make_prompt_cache(model))
            else:
                cache, _ = engine._prefill([int(t) for t in prompt_ids])
                for token in context_ids[len(prompt_ids) :]:
                    engine._step(mx.array([int(token)], dtype=mx.uint32), cache)
                recorder.flush()
    finally:
        engine.model = model
        engine._cache = held
        shadows.remove()
    out = recorder.capture(path, len(context_ids))
    meta = {"engine": engine.name, "class": type(engine).__name__, "dtype": engine.dtype}
    return Capture(out.path, out.context_length, out.tensors, meta)


def named_activations(
    engine: Any, context_ids: Sequence[int], names: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """`capture_activations`: one forward over the context (the prefill path), each module's
    output at every position as float32 [positions, width], by module name."""
    if not context_ids:
        raise InputError("the context is empty")
    capture = capture_mlx(engine, context_ids[:1], context_ids, PREFILL)
    wanted = None if names is None else set(names)
    return {t.point.module: t.values for t in capture.tensors if wanted is None or t.point.module in wanted}
