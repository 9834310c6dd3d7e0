"""An MLX engine with a planted bug, for `gate diagnose`'s tests: `scale_mlp=L:F` multiplies
layer L's MLP output by F (in the model's dtype), as scripts/other_engine_dump.py's
`--scale-mlp` does for transformers. Everything else is the MLX engine as it ships; its
capture reads the planted module because it reads the engine's own modules."""

from __future__ import annotations

from typing import Any

import mlx.nn as nn

from gate.engines.mlx.engine import MLXEngine
from gate.errors import InputError


class ScaledMLP(nn.Module):
    def __init__(self, inner: Any, factor: float) -> None:
        super().__init__()
        self.inner = inner
        self.factor = factor

    def __call__(self, x: Any) -> Any:
        out = self.inner(x)
        return out * self.factor


class PlantedMLXEngine(MLXEngine):
    name = "mlx-planted"

    def __init__(self, model: str, **options: Any) -> None:
        plant = options.pop("scale_mlp", None)
        super().__init__(model, **options)
        if plant:
            try:
                layer, factor = str(plant).split(":")
                block = self.model.model.layers[int(layer)]
            except (ValueError, IndexError):
                raise InputError(f"--engine-opt scale_mlp={plant}: expected LAYER:FACTOR") from None
            block.mlp = ScaledMLP(block.mlp, float(factor))
