"""`oracle.json`: the settings a pin is recorded with (model, engine, dtype, max tokens,
top-k, engine options, the pin's own doctrine), read and checked with file and field named."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from gate.core.verdict.doctrine import check_pin_doctrine
from gate.errors import InputError

_INT_FIELDS = ("max_tokens", "top_k", "tensor_parallel_size", "pipeline_parallel_size", "max_model_len")
_STR_FIELDS = ("model", "engine", "dtype", "revision", "notes")
# Settings that are engine options of the oracle engine, beside `engine_options`.
_ENGINE_FIELDS = ("dtype", "tensor_parallel_size", "pipeline_parallel_size", "max_model_len")


@dataclass(frozen=True, slots=True)
class OracleSettings:
    """oracle.json: how the oracle is run for one model."""

    model: str | None = None
    engine: str = "vllm"
    dtype: str = "bfloat16"
    max_tokens: int = 32
    # vLLM returns at most `max_logprobs` (20 by default) top logprobs per position.
    top_k: int = 20
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_model_len: int | None = None
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    revision: str | None = None
    notes: str | None = None
    # The pin's own doctrine (near_tie_mnats, near_tie_ulps, evidence), measured for this oracle and
    # its usual candidates; `gate run`'s flags override it.
    doctrine: Mapping[str, Any] = field(default_factory=dict)

    def engine_kwargs(self) -> dict[str, Any]:
        """Options for the oracle engine: the named settings, then `engine_options`.

        A parallel size of 1 is the engine's default and is left out, so an oracle engine
        without parallelism (a plugin, a test fake) needs no such option."""
        out: dict[str, Any] = {}
        for name in _ENGINE_FIELDS:
            value = getattr(self, name)
            if value is not None and not (name.endswith("_parallel_size") and value == 1):
                out[name] = value
        out.update(self.engine_options)
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in ("model", "engine", "dtype", *_INT_FIELDS, "revision"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.engine_options:
            out["engine_options"] = dict(self.engine_options)
        if self.doctrine:
            out["doctrine"] = dict(self.doctrine)
        if self.notes is not None:
            out["notes"] = self.notes
        return out

    def encode(self) -> bytes:
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)

    def with_overrides(
        self, *, max_tokens: int | None = None, top_k: int | None = None, engine_opts: Mapping[str, str] | None = None
    ) -> OracleSettings:
        """`gate pin record`'s flags over the folder's settings; `--engine-opt` of a named
        setting (dtype, tensor_parallel_size, ...) replaces it."""
        changes: dict[str, Any] = {}
        if max_tokens is not None:
            changes["max_tokens"] = max_tokens
        if top_k is not None:
            changes["top_k"] = top_k
        extra = dict(self.engine_options)
        for key, raw in (engine_opts or {}).items():
            if key in _ENGINE_FIELDS:
                changes[key] = _setting_value(f"--engine-opt {key}", key, raw)
            else:
                extra[key] = raw
        changes["engine_options"] = extra
        out = replace(self, **changes)
        _check_settings(out, "--engine-opt/--max-tokens/--top-k")
        return out


def _setting_value(where: str, key: str, raw: str) -> Any:
    if key == "dtype":
        return raw
    try:
        return int(raw)
    except ValueError:
        raise InputError(f"{where}={raw}: expected an integer") from None


def _check_settings(s: OracleSettings, where: str) -> None:
    for name in ("max_tokens", "top_k", "tensor_parallel_size", "pipeline_parallel_size"):
        value = getattr(s, name)
        if type(value) is not int or value < 1:
            raise InputError(f"{where}: field '{name}': must be an integer >= 1, found {value!r}")
    if s.max_model_len is not None and (type(s.max_model_len) is not int or s.max_model_len < 1):
        raise InputError(f"{where}: field 'max_model_len': must be an integer >= 1 or null, found {s.max_model_len!r}")


def _check_doctrine(name: str, value: Any) -> None:
    check_pin_doctrine(value, name)


def read_settings(path: Path) -> OracleSettings:
    """Read oracle.json; a missing file means the defaults."""
    name = str(path)
    if not path.exists():
        return OracleSettings()
    try:
        obj = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{name}: bad JSON: {exc}") from None
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror or exc}") from None
    if not isinstance(obj, dict):
        raise InputError(f"{name}: must be a JSON object of oracle settings")
    known = (*_STR_FIELDS, *_INT_FIELDS, "engine_options", "doctrine")
    kwargs: dict[str, Any] = {}
    for key, value in obj.items():
        if key not in known:
            raise InputError(f"{name}: field '{key}': unknown setting (known: {', '.join(known)})")
        if key in _STR_FIELDS and value is not None and not isinstance(value, str):
            raise InputError(f"{name}: field '{key}': must be a string, found {value!r}")
        if key == "engine_options" and not isinstance(value, dict):
            raise InputError(f"{name}: field 'engine_options': must be an object, found {value!r}")
        if key == "doctrine":
            _check_doctrine(name, value)
        kwargs[key] = value
    settings = OracleSettings(**kwargs)
    _check_settings(settings, name)
    return settings
