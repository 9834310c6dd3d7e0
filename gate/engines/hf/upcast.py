"""gate diagnose's reference from the honest engine's own load: float32 by widening the
loaded weights, module by module as each runs, where that is exactly what loading them in
float32 gives.

Loading a model's weights in float32 reads every stored value and widens it; when every
stored floating tensor is in the honest engine's dtype (a bf16 checkpoint and a bf16 honest
engine, the usual case), the honest engine's loaded parameters hold those very values, and
widening them in place gives the float32 load bit for bit: bf16 and fp16 widen to float32
exactly. What must hold, checked here, else the reference is loaded on its own:
- every floating tensor of every `*.safetensors` file is stored in the honest dtype (a
  float32 checkpoint loaded in bf16 has lost bits no widening restores);
- every floating parameter is in the honest dtype or already float32 (a module transformers
  keeps in float32 was loaded from the same stored values);
- every floating buffer is already float32 (buffers are computed at init: one computed in
  the honest dtype would widen from rounded values).
tests/workflows/test_diagnose_reference_upcast.py checks the result against a float32 load,
logits and every capture point bit for bit, on each architecture of the tests (Llama, Qwen3
MoE, the hybrid Qwen3.5 MoE), and that no float32 copy of the weights is held.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import orjson
import torch

# safetensors' dtype names of floating tensors, by torch dtype.
STORED = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
FLOATING = {"BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4"}
HEADER_LIMIT = 100 << 20  # safetensors' own bound on a header


def stored_dtypes(folder: str | Path) -> set[str] | None:
    """The safetensors dtype names of every floating tensor in `folder`'s `*.safetensors`
    files, read from their headers; None when there are none or a header cannot be read."""
    files = sorted(Path(folder).glob("*.safetensors")) if Path(folder).is_dir() else []
    if not files:
        return None
    found: set[str] = set()
    for f in files:
        read = read_header(f)
        if read is None:
            return None
        header, _ = read
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            dtype = entry.get("dtype") if isinstance(entry, dict) else None
            if not isinstance(dtype, str):
                return None
            if dtype in FLOATING:
                found.add(dtype)
    return found


def read_header(f: Path) -> tuple[dict[str, Any], int] | None:
    """A safetensors file's header (a dict) and its length in bytes, bounded by HEADER_LIMIT;
    None when it cannot be read."""
    try:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > HEADER_LIMIT:
                return None
            header = orjson.loads(fh.read(n))
    except (OSError, struct.error, orjson.JSONDecodeError):
        return None
    return (header, n) if isinstance(header, dict) else None


def widens_exactly(engine: Any) -> bool:
    """Whether widening `engine`'s loaded model to float32 in place gives its float32 load."""
    dtype = getattr(engine, "dtype", None)
    model = getattr(engine, "model", None)
    if model is None or dtype not in STORED or dtype == torch.float32:
        return False
    if stored_dtypes(getattr(engine, "model_path", "")) != {STORED[dtype]}:
        return False
    params = all(p.dtype in (dtype, torch.float32) for p in model.parameters() if p.is_floating_point())
    buffers = all(b.dtype == torch.float32 for b in model.buffers() if b.is_floating_point())
    return params and buffers


def widen(engine: Any) -> None:
    """Make `engine` the float32 reference (after `widens_exactly`): its model computes in
    float32 from then on, described as float32, its weights widened module by module while
    each runs (`LazyWidening`) rather than all at once."""
    engine.model._gate_widening = LazyWidening(engine.model)
    engine.model.config.dtype = torch.float32
    engine.dtype = torch.float32
    engine.options = {**engine.options, "dtype": "float32"}


ALIGN = 16  # float32 elements: each widened tensor starts on 64 bytes, as torch's own allocations


class LazyWidening:
    """A model's half-precision weights widened to float32 only while the module using them
    runs, into one reused buffer: the same float32 values, so the same arithmetic and results
    bit for bit as the widened load, without a float32 copy of every weight (on the real
    Qwen3.6-35B-A3B 140 GB) nor the time to fault that much fresh memory in.

    The units: each element of every `nn.ModuleList` (a decoder layer, a vision block) with
    all its parameters, since a module may read a child's weight without calling the child
    (Qwen3.5's DeltaNet passes `conv1d.weight` to its conv function); every other module's own
    parameters (the final norm, the LM head). A plain `nn.Embedding` is not widened: looking
    rows up in bf16 and widening them is the float32 lookup exactly, without widening the whole
    table. Units that never run (the vision tower of a text prompt) are never widened. A unit
    running inside another takes the buffer's next free part, or fresh memory past its end.

    An MoE block's experts (a module with `num_experts` whose own weights are stacked by expert,
    called with the chosen experts' indexes) are a unit of their own inside their layer's, and
    only the rows of the experts its tokens are routed to are widened: every experts forward of
    transformers reads no other row (its eager loop, grouped_mm's groups, batched_mm's gather).
    A prefill of 20 tokens with 8 of 256 experts each reaches about half of them; a decode step
    8. `copied` counts the elements widened.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.units: list[tuple[torch.nn.Module, list[tuple[torch.nn.Module, str, torch.Tensor]]]] = []
        self.handles: list[Any] = []
        self.copied = 0
        inside: set[int] = set()
        size = 0  # the most one unit holds at once, with the units that run inside it
        for module in model.modules():
            if isinstance(module, torch.nn.ModuleList):
                for layer in module:
                    if id(layer) in inside:
                        continue
                    members = list(layer.modules())
                    inside.update(id(m) for m in members)
                    routed = {id(m): count for m in members if (count := _stacked_by_expert(m))}
                    self._unit(layer, [m for m in members if id(m) not in routed])
                    for m in members:
                        if id(m) in routed:
                            self._unit(m, [m], experts=routed[id(m)])
                    size = max(size, sum(_padded(t) for m in members for _, t in _narrow_params(m)))
        for module in model.modules():
            if id(module) in inside:
                continue
            if type(module) is torch.nn.Embedding and module.max_norm is None and narrow(module.weight):
                self.handles.append(module.register_forward_hook(_widen_output))
            else:
                self._unit(module, [module])
                size = max(size, sum(_padded(t) for _, t in _narrow_params(module)))
        device = next((t.device for _, entries in self.units for _, _, t in entries), torch.device("cpu"))
        self.buffer = torch.empty(size, dtype=torch.float32, device=device)
        self.used = 0

    def _unit(self, unit: torch.nn.Module, members: list[torch.nn.Module], experts: int = 0) -> None:
        """Widen `members`' parameters while `unit` runs; with `experts` (the unit is an MoE
        block's experts), only the rows of the experts its call is routed to."""
        entries = [(m, name, t) for m in members for name, t in _narrow_params(m)]
        if not entries:
            return
        self.units.append((unit, entries))
        state: dict[str, int] = {}

        def enter(_module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            state["start"] = self.used
            rows = _routed_rows(args, kwargs, experts) if experts else None
            for m, name, t in entries:
                # A plain tensor while it runs.
                m._parameters[name] = self._take(t, rows if t.ndim == 3 and t.shape[0] == experts else None)  # type: ignore[assignment]

        def leave(_module: torch.nn.Module, _args: Any, _out: Any) -> None:
            for m, name, t in entries:
                m._parameters[name] = t  # type: ignore[assignment]  # the Parameter it was
            self.used = state["start"]

        self.handles.append(unit.register_forward_pre_hook(enter, with_kwargs=True))
        self.handles.append(unit.register_forward_hook(leave, always_call=True))

    def _take(self, t: torch.Tensor, rows: list[tuple[int, int]] | None = None) -> torch.Tensor:
        """`t` in float32 in the buffer's next free part; with `rows`, only those runs of its
        first dimension (the rest of the part is left as it was: nothing reads it)."""
        n = t.numel()
        if self.used + n <= self.buffer.numel() and t.device == self.buffer.device:
            out = self.buffer[self.used : self.used + n].view(t.shape)
            self.used += _padded(t)
        else:
            out = torch.empty(t.shape, dtype=torch.float32, device=t.device)
        if rows is None:
            self.copied += n
            return out.copy_(t)
        for a, b in rows:
            out[a:b].copy_(t[a:b])
            self.copied += (b - a) * (n // t.shape[0])
        return out

    def remove(self) -> None:
        """Remove the hooks and drop the units: the hooks' closures and the modules they widen
        hold each other, which only the cyclic collector would otherwise free."""
        for h in self.handles:
            h.remove()
        self.handles = []
        self.units = []


def narrow(t: torch.Tensor) -> bool:
    """Whether `t` is a floating tensor narrower than float32 (what widening widens)."""
    return t.is_floating_point() and t.dtype in (torch.bfloat16, torch.float16)


def _narrow_params(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """`module`'s own parameters that widening widens."""
    return [(name, t) for name, t in module._parameters.items() if t is not None and narrow(t)]


def _stacked_by_expert(module: torch.nn.Module) -> int:
    """The expert count of an MoE block's experts as transformers stacks them (a module with
    `num_experts`, no child holding weights, its own weights 3-D with the experts first); 0
    for any other module."""
    count = getattr(module, "num_experts", None)
    if not isinstance(count, int) or count < 2:
        return 0
    if any(any(True for _ in child.parameters()) for child in module.children()):
        return 0
    own = [t for _, t in _narrow_params(module)]
    return count if own and all(t.ndim == 3 and t.shape[0] == count for t in own) else 0


def _routed_rows(args: Any, kwargs: Any, experts: int) -> list[tuple[int, int]] | None:
    """The runs [a, b) of expert indexes an experts call is routed to: its one integer tensor
    argument (transformers' `top_k_index`); None (every row) when it has not exactly one."""
    found = [
        a
        for a in (*args, *(kwargs or {}).values())
        if isinstance(a, torch.Tensor) and not a.is_floating_point() and not a.is_complex() and a.dtype != torch.bool
    ]
    if len(found) != 1:
        return None
    hit = [int(e) for e in torch.unique(found[0]).tolist() if 0 <= int(e) < experts]
    runs: list[tuple[int, int]] = []
    for e in hit:  # sorted: torch.unique sorts
        if runs and runs[-1][1] == e:
            runs[-1] = (runs[-1][0], e + 1)
        else:
            runs.append((e, e + 1))
    return runs


def _padded(t: torch.Tensor) -> int:
    return -(-t.numel() // ALIGN) * ALIGN


def _widen_output(_module: torch.nn.Module, _args: Any, out: torch.Tensor) -> torch.Tensor:
    return out.to(torch.float32)
