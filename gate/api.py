"""The Python API's calls that are more than a re-export: loading a pin by model id or
folder, gating an engine against it, and judging two traces. `import gate` names them
(`gate.load_pin`, `gate.run`, `gate.compare`); everything they return is a frozen record of
the core. `gate.compare` is the one judging function every door calls
(`gate.workflows.run.judge`): the oracle's own doctrine unless the caller passes one."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from gate.core.engine import CONTRACT_METHODS, Engine, check_contract, lacking_methods
from gate.core.pins.oracle_settings import read_settings
from gate.core.pins.pin import SETTINGS_FILE, Pin
from gate.core.pins.pin import load_pin as _load_pin_by_id
from gate.core.verdict.doctrine import Doctrine
from gate.core.verdict.result import GateResult
from gate.engines.registry import load_engine
from gate.errors import PinError
from gate.models.default import DEFAULT_MODEL
from gate.workflows.common.engine_calls import engine_name, open_engine
from gate.workflows.run.core import RunPlan, gate_run
from gate.workflows.run.judge import judge as compare

__all__ = ["compare", "load_pin", "run"]

PathLike = str | os.PathLike[str]


def load_pin(model: PathLike, pins_dir: PathLike | None = None) -> Pin:
    """The pin for `model`, a model id (`HuggingFaceTB/SmolLM2-135M-Instruct`, looked up
    as `gate run --model` does, under `pins_dir` first when given) or a pin folder's path.
    `pin.trace` is the oracle's trace, `pin.doctrine` the doctrine it carries. PinError
    (exit 2) when there is none."""
    folder = Path(model)
    if folder.is_dir() and (folder / SETTINGS_FILE).is_file():
        settings_path = folder / SETTINGS_FILE
        model_id = read_settings(settings_path).model
        parts = tuple(model_id.split("/")) if model_id else ()
        real = folder.resolve()
        if not parts or real.parts[-len(parts) :] != parts:
            raise PinError(
                f"{settings_path}: names model {model_id!r}, but a pin folder is the model id's path under its pins "
                f"folder ({folder} is not)"
            )
        return _load_pin_by_id(model_id or "", real.parents[len(parts) - 1])
    return _load_pin_by_id(str(model), Path(pins_dir) if pins_dir is not None else None)


def run(
    engine: Engine | str,
    model: PathLike | None = None,
    *,
    options: Mapping[str, str] | None = None,
    doctrine: Doctrine | None = None,
    pins_dir: PathLike | None = None,
    timeout: float | None = None,
) -> GateResult:
    """Gate `engine` against the pin of `model` (default: gate's default model) as `gate run`
    does: provenance checks, the free run, forced decode after each divergence, adjudication.

    `engine` is a loaded engine object (any `gate.engine.Engine`; gate does not close it) or
    an engine name (`"hf"`, an installed plugin's name, `"module:Class"`), loaded on the pin's
    model with `options` (the `--engine-opt` strings) and closed afterwards. `doctrine`
    defaults to the pin's own; `timeout` (seconds) bounds each engine call.
    """
    if not isinstance(engine, str) and len(lacking_methods(engine)) == len(CONTRACT_METHODS):
        raise TypeError(
            f"gate.run: engine is a {type(engine).__name__}: expected a loaded engine (a gate.engine.Engine) or an "
            "engine name (a str: 'hf', an installed plugin's name, 'module:Class')"
        )
    if model is not None and not isinstance(model, str | os.PathLike):
        raise TypeError(f"gate.run: model is a {type(model).__name__}: expected a model id or a pin folder's path")
    if doctrine is not None and not isinstance(doctrine, Doctrine):
        raise TypeError(f"gate.run: doctrine is a {type(doctrine).__name__}: expected a gate.Doctrine or None")
    if not isinstance(engine, str):
        check_contract(engine, repr(engine_name(engine)))
    pin = load_pin(model if model is not None else DEFAULT_MODEL, pins_dir)
    judge = doctrine if doctrine is not None else pin.doctrine
    opts = {str(k): str(v) for k, v in (options or {}).items()}
    plan = RunPlan(engine_options=opts, timeout=timeout)
    if not isinstance(engine, str):
        return gate_run(engine, pin, judge, plan).result
    name = engine
    with open_engine(lambda: load_engine(name, pin.model, opts), name) as loaded:
        return gate_run(loaded, pin, judge, plan).result
