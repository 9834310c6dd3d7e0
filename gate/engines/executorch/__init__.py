"""The ExecuTorch engine: the model exported to a `.pte` program (KV cache, XNNPACK) and run
by ExecuTorch's own runtime.

- `engine`: `ExecuTorchEngine`, the engine gate drives (`--engine executorch`).
- `export`: the export of a Hugging Face folder to a `.pte` (recipes `fp32` and `8da4w`).
- `cache`: the cached builds under gate's cache, each with a manifest.

Nothing is imported here, so naming the package costs no torch import.
"""
