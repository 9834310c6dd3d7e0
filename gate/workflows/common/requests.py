"""The option groups several commands share, as records a workflow takes.

A command collects its options once into a frozen request (`RunRequest`, `PinRecordRequest`,
...); the groups below are the parts of those requests that mean the same in every command:
which engine runs the candidate (`--engine`, `--engine-opt`, `--model-path`) and how the
pin's doctrine is changed (`--near-tie-mnats`, `--near-tie-ulps`, `--no-evidence`).
No printing here; nothing heavy is imported until an engine is built.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gate.errors import InputError
from gate.workflows.common.progress import QUIET, Progress

if TYPE_CHECKING:
    from gate.core.engine import Engine
    from gate.core.pins.pin import Pin

# What a workflow tells the person (the CLI prints it on stderr), one line a call.
Say = Callable[[str], None]
# What opens a progress display for the length of one stage (the CLI's bar on stderr).
ProgressDisplay = Callable[[], AbstractContextManager[Progress]]


def silent(_line: str) -> None:
    """A `Say` that says nothing (a workflow called from Python)."""


@contextmanager
def no_progress() -> Iterator[Progress]:
    """A `ProgressDisplay` that shows nothing."""
    yield QUIET


def default_model() -> str:
    from gate.models.default import DEFAULT_MODEL

    return DEFAULT_MODEL


def parse_engine_opts(pairs: Sequence[str] | None) -> dict[str, str]:
    """`["k=v", ...]` to a dict; a pair without `=` is an input error."""
    out: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--engine-opt {pair!r}: expected key=value")
        out[key.strip()] = value
    return out


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """The candidate engine: its name (`--engine`), its options as given (`--engine-opt k=v`,
    parsed by `options()`), and the folder its weights load from (`--model-path`, else the pin's model)."""

    engine: str | None = None
    engine_opts: tuple[str, ...] = ()
    model_path: Path | None = None

    def name(self, default: str = "hf") -> str:
        return self.engine or default

    def options(self) -> dict[str, str]:
        return parse_engine_opts(self.engine_opts)

    def weights(self, pin: Pin) -> str:
        """What the engine loads: `--model-path` if given (it must exist: said here, not as
        whatever the engine's library makes of a missing path), else the pin's model."""
        if self.model_path is None:
            return pin.model
        if not os.path.exists(self.model_path):
            raise InputError(f"--model-path {self.model_path}: no such file or folder")
        return str(self.model_path)

    def loader(self, pin: Pin, opts: dict[str, str], name: str | None = None) -> Callable[[], Engine]:
        """What builds the candidate engine for `pin` (it loads when called)."""
        engine_name = name or self.name()
        weights = self.weights(pin)

        def load() -> Engine:
            from gate.engines.registry import load_engine

            return load_engine(engine_name, weights, opts)

        return load


@dataclass(frozen=True, slots=True)
class DoctrineFlags:
    """The doctrine flags a command was given: each changes its own field of the pin's
    doctrine and keeps the rest (`gate.core.verdict.doctrine.resolve_doctrine`)."""

    near_tie_mnats: float | None = None
    near_tie_ulps: float | None = None
    no_evidence: bool = False

    def overrides(self) -> dict[str, Any]:
        """The flags given, as per-field overrides of the pin's doctrine."""
        out: dict[str, Any] = {}
        if self.near_tie_mnats is not None:
            out["near_tie_mnats"] = self.near_tie_mnats
        if self.near_tie_ulps is not None:
            out["near_tie_ulps"] = self.near_tie_ulps
        if self.no_evidence:
            out["evidence"] = None
        return out

    def check(self) -> dict[str, Any]:
        """The overrides, a bad threshold refused (exit 2) before any work."""
        from gate.core.verdict.doctrine import apply_overrides

        flags = self.overrides()
        apply_overrides({}, {k: v for k, v in flags.items() if v is not None})
        return flags
