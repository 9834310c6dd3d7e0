"""The sub-parts `gate diagnose` reads inside a Qwen3.5/3.6 decoder layer (transformers'
`Qwen3_5Moe*` and `Qwen3_5*` modules), on both paths, from the engine's own forward:

- the Gated DeltaNet (`linear_attn`): its causal conv1d's output after the SiLU (the tensor
  its forward splits into q, k and v; there is no conv1d module call to hook, its weights go
  to a function), the gated delta rule's core output (the gated RMSNorm's input), the output
  gate z (`in_proj_z`), the gated RMSNorm's output (`norm`); its out_proj's output is the
  layer's `linear_attn` point;
- the gated full attention (`self_attn` with `attn_output_gate`): its output gate (sigmoid
  of the gate half of q_proj's output) and softmax(q·k)·v before the gate (o_proj's input
  divided by that gate);
- the MoE block with a shared expert (`mlp`): the chosen experts and their weights
  ([positions, experts]), the routed experts' sum, the shared expert, its sigmoid gate, and
  what the shared expert adds to the block (the block's output minus the routed experts':
  a dropped or wrong gate shows there, whatever the block's forward calls).

Each read is a hook on the module (or, for the conv, a watch on the split during the
DeltaNet's forward) that calls `emit(index, tensor)` with the tensor's rows, one
per token of the forward; a dense model has none of these parts and gets none of these reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from gate.core.diagnosis.capture import (
    ATT_CORE,
    ATT_GATE,
    LA_CONV,
    LA_DELTA,
    LA_GATE,
    LA_NORM,
    ROUTED,
    ROUTER_CHOICE,
    SHARED,
    SHARED_GATE,
    SHARED_GATED,
    Point,
)

Emit = Callable[[int, torch.Tensor], None]


class SplitWatch:
    """Hands the first tensor split along a watched width to its callback: the DeltaNet's
    conv output, split into q, k and v right after the conv in both of its paths. It stands
    in for `torch.split` and `Tensor.split` from the DeltaNet's forward's start (`start`)
    until that split or the forward's end (`stop`), so that only split calls pass through
    Python: a function mode over the forward sent every torch call of the gated delta rule
    through Python (a sixth of a tiny model's capture of both paths)."""

    def __init__(self) -> None:
        self.watch: tuple[int, Callable[[torch.Tensor], None]] | None = None
        self.saved: tuple[Any, Any] | None = None

    def start(self, width: int, found: Callable[[torch.Tensor], None]) -> None:
        self.stop()
        self.watch = (width, found)
        function, method = self.saved = (torch.split, torch.Tensor.split)

        def split(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            self._seen(tensor)
            return function(tensor, *args, **kwargs)

        def split_method(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            self._seen(tensor)
            return method(tensor, *args, **kwargs)

        torch.split = split
        torch.Tensor.split = split_method  # type: ignore[method-assign,assignment]

    def _seen(self, tensor: Any) -> None:
        watch = self.watch
        if watch is not None and isinstance(tensor, torch.Tensor) and tensor.shape[-1] == watch[0]:
            self.stop()
            watch[1](tensor)

    def stop(self) -> None:
        self.watch = None
        if self.saved is not None:
            torch.split, torch.Tensor.split = self.saved  # type: ignore[method-assign]
            self.saved = None


def _removed(index: int, value: torch.Tensor) -> None:
    raise RuntimeError("a sub-part hook fired after its hooks were removed")


class SubParts:
    """The sub-part points of one model and the hooks that read them; `points` continue the
    caller's point indexes from `first`."""

    def __init__(self, layers: list[tuple[int, str, Any]], first: int, emit: Emit) -> None:
        self.points: list[Point] = []
        self.handles: list[Any] = []
        self.spy: SplitWatch | None = None
        self._first, self._emit = first, emit
        for index, prefix, layer in layers:
            self._deltanet(index, prefix, getattr(layer, "linear_attn", None))
            self._gated_attention(index, prefix, getattr(layer, "self_attn", None))
            self._shared_moe(index, prefix, getattr(layer, "mlp", None))

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Around the forwards: the conv reads' stand-ins for the split, set by each DeltaNet's
        forward, never outlive them (a forward that raised leaves them set)."""
        try:
            yield
        finally:
            if self.spy is not None:
                self.spy.stop()

    def remove(self) -> None:
        """Remove the hooks, and the caller's `emit` with them: it is the caller's bound method,
        and the caller holds this object and the model's modules, a cycle that would keep a
        closed model's weights resident until the cyclic collector runs."""
        for h in self.handles:
            h.remove()
        self.handles = []
        self._emit = _removed

    def _point(self, layer: int, part: str, module: str) -> int:
        self.points.append(Point(layer, part, module))
        return self._first + len(self.points) - 1

    def _deltanet(self, layer: int, prefix: str, net: Any) -> None:
        needed = ("conv_dim", "value_dim", "in_proj_z", "norm", "out_proj")
        if net is None or not all(hasattr(net, a) for a in needed):
            return
        name = f"{prefix}.linear_attn"
        conv, delta = self._point(layer, LA_CONV, f"{name}.conv1d"), self._point(layer, LA_DELTA, f"{name}.delta_rule")
        gate, norm = self._point(layer, LA_GATE, f"{name}.in_proj_z"), self._point(layer, LA_NORM, f"{name}.norm")
        width, emit = int(net.value_dim), self._emit
        spy = self.spy = self.spy or SplitWatch()

        def start(module: Any, args: Any) -> None:
            spy.start(int(net.conv_dim), lambda t: emit(conv, t))

        def stop(module: Any, args: Any, output: Any) -> None:
            spy.stop()

        self.handles += [
            net.register_forward_pre_hook(start),
            net.register_forward_hook(stop),
            net.in_proj_z.register_forward_hook(lambda m, a, out: emit(gate, out)),
            net.norm.register_forward_pre_hook(lambda m, a: emit(delta, a[0].reshape(-1, width))),
            net.norm.register_forward_hook(lambda m, a, out: emit(norm, out.reshape(-1, width))),
        ]

    def _gated_attention(self, layer: int, prefix: str, attn: Any) -> None:
        config = getattr(attn, "config", None)
        if attn is None or not getattr(config, "attn_output_gate", False):
            return
        if not all(hasattr(attn, a) for a in ("q_proj", "o_proj", "head_dim")):
            return
        name = f"{prefix}.self_attn"
        gate, core = self._point(layer, ATT_GATE, f"{name}.output_gate"), self._point(layer, ATT_CORE, f"{name}.core")
        head, emit = int(attn.head_dim), self._emit
        seen: dict[str, torch.Tensor] = {}

        def read_gate(module: Any, args: Any, out: torch.Tensor) -> None:
            rows = out.reshape(-1, out.shape[-1])
            g = torch.sigmoid(rows.float().view(rows.shape[0], -1, 2 * head)[..., head:]).reshape(rows.shape[0], -1)
            seen["gate"] = g
            emit(gate, g)

        def read_core(module: Any, args: Any) -> None:
            g = seen.pop("gate", None)
            x = args[0].reshape(-1, args[0].shape[-1]).float()
            if g is not None and g.shape == x.shape:
                emit(core, x / g)

        self.handles += [attn.q_proj.register_forward_hook(read_gate), attn.o_proj.register_forward_pre_hook(read_core)]

    def _shared_moe(self, layer: int, prefix: str, block: Any) -> None:
        needed = ("gate", "experts", "shared_expert", "shared_expert_gate")
        if block is None or not all(isinstance(getattr(block, a, None), torch.nn.Module) for a in needed):
            return
        name = f"{prefix}.mlp"
        choice = self._point(layer, ROUTER_CHOICE, f"{name}.gate.choice")
        routed, shared = (
            self._point(layer, ROUTED, f"{name}.experts"),
            self._point(layer, SHARED, f"{name}.shared_expert"),
        )
        gate = self._point(layer, SHARED_GATE, f"{name}.shared_expert_gate")
        gated = self._point(layer, SHARED_GATED, f"{name}.shared_expert.gated")
        experts, emit = int(getattr(block.gate, "num_experts", 0)), self._emit
        seen: dict[str, torch.Tensor] = {}

        def read_choice(module: Any, args: Any, out: Any) -> None:
            if not (isinstance(out, tuple) and len(out) >= 3 and experts > 0):
                return
            scores, indices = out[1], out[2]
            dense = torch.zeros(indices.shape[0], experts, dtype=torch.float32, device=indices.device)
            emit(choice, dense.scatter(1, indices.long(), scores.float()))

        def read_routed(module: Any, args: Any, out: torch.Tensor) -> None:
            seen["routed"] = out.reshape(-1, out.shape[-1])
            emit(routed, out)

        def read_gated(module: Any, args: Any, out: Any) -> None:
            r = seen.pop("routed", None)
            total = out[0] if isinstance(out, tuple) else out
            if r is not None and isinstance(total, torch.Tensor):
                emit(gated, total.reshape(-1, total.shape[-1]).float() - r.float())

        self.handles += [
            block.gate.register_forward_hook(read_choice),
            block.experts.register_forward_hook(read_routed),
            block.shared_expert.register_forward_hook(lambda m, a, out: emit(shared, out)),
            block.shared_expert_gate.register_forward_hook(lambda m, a, out: emit(gate, torch.sigmoid(out.float()))),
            # Before the block's own point, so that what the shared expert adds precedes the sum in forward order.
            block.register_forward_hook(read_gated, prepend=True),
        ]
