"""`gate goldens record` and `gate goldens check` as requests: the pin and the golden file
found, the engine loaded, the golden recorded or judged (`gate.workflows.goldens.core`), and
the file written atomically with a backup.

No printing: what the person should read goes to `say`, the progress to `display`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from gate.core.goldens.golden import (
    DEFAULT_ENGINE,
    accepted_golden,
    check_golden_against_pin,
    encode_golden,
    find_golden,
    path_for_writing,
)
from gate.core.goldens.moves import GoldensResult, find_moves, goldens_summary
from gate.core.pins.pin import Pin, doctrine_for, load_pin
from gate.core.storage.atomic import atomic_write
from gate.core.storage.files import display_path
from gate.core.traces.reader import read_trace
from gate.core.traces.trace import Trace
from gate.errors import InputError
from gate.text import plural
from gate.workflows.common.engine_calls import open_engine
from gate.workflows.common.requests import (
    DoctrineFlags,
    EngineRequest,
    ProgressDisplay,
    Say,
    default_model,
    no_progress,
    silent,
)
from gate.workflows.goldens.core import check_golden, record_golden


@dataclass(frozen=True, slots=True)
class GoldensRequest:
    """Everything `gate goldens record` or `gate goldens check` was asked."""

    model: str | None = None
    engine: EngineRequest = field(default_factory=EngineRequest)
    pins_dir: Path | None = None
    goldens_dir: Path | None = None
    golden: Path | None = None
    force: bool = False  # record: replace an existing golden
    accept: bool = False  # check: rewrite the moved goldens
    doctrine: DoctrineFlags = field(default_factory=DoctrineFlags)  # check

    def engine_name(self) -> str:
        return self.engine.name(DEFAULT_ENGINE)

    def pin_model(self) -> str:
        """The model whose pin judges (`goldens check --golden` names its own, later)."""
        return self.model or default_model()


@dataclass(frozen=True, slots=True)
class GoldenTarget:
    """Where `goldens record` writes, found before the engine loads."""

    pin: Pin
    path: Path
    options: dict[str, str]


def golden_target(request: GoldensRequest) -> GoldenTarget:
    opts = request.engine.options()
    pin = load_pin(request.model or default_model(), request.pins_dir)
    path = request.golden
    if path is None:
        path = path_for_writing(pin.model, request.engine_name(), request.goldens_dir)
    if path.is_dir():
        raise InputError(f"{path}: is a directory")
    return GoldenTarget(pin=pin, path=path, options=opts)


def record_goldens(
    request: GoldensRequest, target: GoldenTarget, *, say: Say = silent, display: ProgressDisplay = no_progress
) -> Trace:
    """Record the golden and write it (the old one kept as a backup, what moved said)."""
    pin, path, opts, engine_name = target.pin, target.path, target.options, request.engine_name()
    old = None
    if path.exists():
        try:
            old = read_trace(path, role="candidate")
        except InputError as exc:
            say(f"gate: the old golden cannot be read ({exc}); it is replaced all the same")

    say(f"recording the {engine_name} golden for {pin.model}: {plural(len(pin.trace.records), 'prompt')}")
    load = request.engine.loader(pin, opts, engine_name)
    with open_engine(load, engine_name) as eng, display() as progress:
        trace = record_golden(eng, pin, options=opts, path=str(path), progress=progress)

    if old is not None:
        _say_moves(old, trace, pin, engine_name, path, say)
    kept = atomic_write(path, encode_golden(trace), overwrite=request.force, backup=path.exists())
    if kept is not None:
        say(f"kept the old golden as {kept}")
    positions = sum(len(r.token_ids) for r in trace.records)
    say(
        f"golden written to {path}: {plural(len(trace.records), 'prompt')}, {plural(positions, 'position')} "
        f"({_engine_line(dict(trace.header.engine), opts)})"
    )
    return trace


def _say_moves(old: Trace, trace: Trace, pin: Pin, engine_name: str, path: Path, say: Say) -> None:
    try:
        check_golden_against_pin(old, pin)
        # The moves are judged as `gate goldens check` judges them: by the pin's doctrine.
        moves = find_moves(old, trace, pin.trace, doctrine_for(pin))
        result = GoldensResult(
            model=pin.model,
            engine=engine_name,
            golden_path=str(path),
            prompts=len(trace.records),
            positions=sum(len(r.token_ids) for r in old.records),
            moves=moves,
            doctrine=doctrine_for(pin),
        )
        say(f"against the old golden: {goldens_summary(result)}")
        for m in moves:
            say(f"  {m.prompt_id} @ {m.position}: {m.label}: {m.reason}")
    except InputError as exc:
        say(f"the old golden was for other prompts ({exc})")


def _engine_line(info_engine: dict[str, object] | None, opts: dict[str, str]) -> str:
    given = ", ".join(f"{k}={v}" for k, v in opts.items()) or "default options"
    if not info_engine:
        return given
    return f"engine {info_engine.get('name')} {info_engine.get('version')}, {given}"


@dataclass(frozen=True, slots=True)
class GoldensCheck:
    """A golden re-run and judged: the result, the old golden and the fresh run (what
    `--accept` writes over the moved prompts)."""

    result: GoldensResult
    old: Trace
    fresh: Trace
    path: Path


def check_goldens(request: GoldensRequest, *, display: ProgressDisplay = no_progress) -> GoldensCheck:
    """Re-run the engine and judge every golden that moved (nothing written)."""
    opts = request.engine.options()
    engine_name = request.engine_name()
    model = request.model
    if request.golden is not None:
        path = request.golden
        old = read_trace(path, role="candidate")
        model = model or old.header.model
    else:
        model = model or default_model()
        path = find_golden(model, engine_name, request.goldens_dir, pins_dir=request.pins_dir)
        old = read_trace(path, role="candidate")
    old = replace(old, path=display_path(path))
    pin = load_pin(model, request.pins_dir)
    check_golden_against_pin(old, pin)  # before the model loads
    # The pin's own doctrine (it travels with the pin trace) unless flags override it.
    doctrine = doctrine_for(pin, request.doctrine.overrides())

    load = request.engine.loader(pin, opts, engine_name)
    with open_engine(load, engine_name) as eng, display() as progress:
        result, fresh = check_golden(eng, pin, old, doctrine, options=opts, progress=progress)
    return GoldensCheck(result=result, old=old, fresh=fresh, path=path)


def accept_moves(check: GoldensCheck) -> GoldensResult:
    """The moved goldens rewritten with the fresh tokens (a backup kept): `--accept`."""
    new = accepted_golden(check.old, check.fresh, check.result.moves)
    kept = atomic_write(check.path, encode_golden(new), overwrite=True, backup=True)
    return replace(check.result, accepted=display_path(check.path), backup=display_path(kept) if kept else None)
