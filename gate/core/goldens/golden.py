"""Goldens: a candidate engine's own greedy outputs, kept so that a change to the engine
can be proven inert, or its every effect explained.

A golden is a trace v1 file (role candidate) at `goldens/<org>/<model>/<engine>.jsonl`:
the engine's token ids for every pinned prompt, with the provenance of the run in its
header (engine name, version and options, device, dtype, the weights and tokenizer
hashes, gate's git commit when known, and the pin it was taken against: its path and
sha256). One golden per engine and model; the options it was recorded with are in the
header, and `gate goldens check` lists any option that differs now.

Checking re-runs the engine over the pinned prompts. For every prompt whose tokens moved,
the first moved position is judged against the oracle pin, where the golden still shares
the oracle's context there (its tokens before that position are the oracle's):
- "was recording a tie-break": the oracle holds the old and the new token at an exact tie
  (bit-identical logprobs), both ratified by the doctrine against the oracle's choice;
- "near-tie flip": both within the doctrine's near-tie threshold of the oracle's choice;
- "real change": anything else, or no oracle evidence (the golden had already left the
  oracle's path, or a token is outside the oracle's top-k).

This module is the golden files (locating, provenance, the header, reading against the
pin); judging the moves is `gate.core.goldens.moves`, and the runs are
`gate.workflows.goldens.core`. No engine, no printing, no torch.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gate.core.goldens.moves import GOLDEN_VERSION, GoldenMove
from gate.core.pins.pin import Pin, check_model_id
from gate.core.storage.files import data_roots, file_sha256, is_packaged, portable, portable_path
from gate.core.traces.trace import PromptRecord, Trace, TraceHeader, encode_trace
from gate.errors import InputError, TraceError
from gate.version import __version__

GOLDENS_DIRNAME = "goldens"
ENV_GOLDENS_DIR = "GATE_GOLDENS_DIR"
DEFAULT_ENGINE = "hf"


# A token the oracle chose itself; the adjudication classes for any other.

# Engine provenance that says where a file lay on the recording machine, not what ran.
_LOCAL_INFO_KEYS = ("model_path",)


# --------------------------------------------------------------------------- locating


def engine_key(engine: str) -> str:
    """The file name stem for an engine: its name, with anything but letters, digits, `.`,
    `_`, `-` and `@` made `_` (so `module:Class` names stay one file in the folder)."""
    key = re.sub(r"[^A-Za-z0-9._@-]", "_", engine.strip())
    if not key or key.strip(".") == "":
        raise InputError(f"--engine {engine!r}: not a usable engine name for a golden file")
    return key


def search_roots(goldens_dir: Path | None = None, *, cwd: Path | None = None) -> list[Path]:
    """Where goldens are looked for, in order: --goldens-dir; else $GATE_GOLDENS_DIR; else
    ./goldens and the goldens/ of the checkout gate runs from (as pins are found)."""
    return data_roots(GOLDENS_DIRNAME, ENV_GOLDENS_DIR, goldens_dir, cwd=cwd)


def golden_path(model: str, engine: str, root: Path) -> Path:
    """`root/<org>/<model>/<engine>.jsonl`; a model id that would leave `root` is an input error."""
    check_model_id(model)
    path = Path(root).joinpath(*model.split("/"), f"{engine_key(engine)}.jsonl")
    if not path.resolve().is_relative_to(Path(root).resolve()):
        raise InputError(f"--model {model!r}: {path} leads outside {root}")
    return path


def find_golden(model: str, engine: str, goldens_dir: Path | None = None, *, pins_dir: Path | None = None) -> Path:
    """The golden file in the first search root that has one; none is an input error that
    says how to record it (the command quoted, with the folders the search was given, so
    that it runs as printed)."""
    roots = search_roots(goldens_dir)
    for root in roots:
        path = golden_path(model, engine, root)
        if path.is_file():
            return path
    looked = ", ".join(str(r) for r in roots)
    words = ["gate", "goldens", "record", "--model", model, "--engine", engine]
    if goldens_dir is not None:
        words += ["--goldens-dir", str(goldens_dir)]
    if pins_dir is not None:
        words += ["--pins-dir", str(pins_dir)]
    raise InputError(
        f"no golden for {model} with engine {engine!r} (looked for {golden_path(model, engine, roots[0]).name} "
        f"under {looked}). Record one first",
        hint=shlex.join(words),
    )


def path_for_writing(model: str, engine: str, goldens_dir: Path | None = None) -> Path:
    """Where `gate goldens record` writes: the existing golden if any, else under the first root."""
    roots = search_roots(goldens_dir)
    for root in roots:
        path = golden_path(model, engine, root)
        if path.is_file():
            if is_packaged(path):
                # Never written: the installed package's goldens are its own.
                return golden_path(model, engine, roots[0])
            return path
    return golden_path(model, engine, roots[0])


# --------------------------------------------------------------------------- provenance


def pin_reference(pin: Pin) -> dict[str, Any]:
    """The pin a golden is taken against: its path, the file's sha256, its suite's hash."""
    ref: dict[str, Any] = {
        # Elsewhere than under gate's checkout, home or cache: `.../<org>/<model>/pin.jsonl`.
        "path": portable_path(pin.folder.pin_path.resolve(), tail=len(pin.model.split("/")) + 1),
        "sha256": file_sha256(pin.folder.pin_path) if pin.folder.pin_path.is_file() else None,
        "suite_sha256": pin.suite.sha256,
        "created_at": pin.provenance("created_at"),
    }
    return {k: v for k, v in ref.items() if v is not None}


def golden_header(
    *,
    pin: Pin,
    info: Mapping[str, Any],
    options: Mapping[str, str],
    git: Mapping[str, Any],
    hashes: Mapping[str, str] | None = None,
    created_at: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> TraceHeader:
    """A golden's header: the engine's own `info()` (name, version, options, ...), the
    options given on the command line, device, dtype, hashes, gate's commit (`git`:
    `gate.workflows.common.provenance.project_commit` reads it) and the pin.
    Paths are said without this machine's folders (`gate.core.storage.files.portable`)."""
    engine = portable({k: v for k, v in info.items() if k not in _LOCAL_INFO_KEYS})
    engine.setdefault("name", "unknown")
    engine.setdefault("version", "unknown")
    head: dict[str, Any] = {
        "golden": GOLDEN_VERSION,
        "engine_options": portable(dict(options)),
        "device": info.get("device"),
        "dtype": info.get("dtype"),
        # Where it was recorded: a golden reproduces bit for bit only on the same machine key.
        "hardware": info.get("hardware"),
        **dict(hashes or {}),
        "gate_version": __version__,
        **dict(git),
        "pin": pin_reference(pin),
        "created_at": created_at or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **dict(extra or {}),
    }
    head = {k: v for k, v in head.items() if v is not None}
    return TraceHeader(role="candidate", model=pin.model, top_k=0, engine=engine, extra=head)


def option_changes(
    golden_info: Mapping[str, Any],
    info: Mapping[str, Any],
    golden_options: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, tuple[Any, Any]]:
    """Engine options whose values differ between the golden's engine and this run's:
    name -> (golden's, now's), None where an option was not set (the engine's default).

    Both engines' `info()["options"]` (defaults included) when both report them; else the
    options given on the command line: `golden_options` as the golden's header records
    them (`engine_options`), `options` this run's. Never one side's engine options against
    the other's command line; a golden that recorded neither has nothing to compare."""
    was: Any = golden_info.get("options")
    now: Any = info.get("options")
    if not isinstance(was, Mapping) or not isinstance(now, Mapping):
        was, now = golden_options, options if options is not None else {}
    if not isinstance(was, Mapping) or not isinstance(now, Mapping):
        return {}
    return {k: (was.get(k), now.get(k)) for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)}


def engine_summary(info: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("name", "version", "device", "dtype", "tie_break", "options")
    return {k: info[k] for k in keys if info.get(k) is not None}


def golden_record(rec: PromptRecord, tokens: Sequence[str] | None = None) -> PromptRecord:
    """What a golden keeps of a candidate record: ids, tokens and their text (`tokens`
    where the record has none), why it ended. Logprobs and engine extras are left out: a
    golden records choices, and its diff in review shows only them."""
    texts = rec.tokens if rec.tokens is not None else tokens
    return PromptRecord(
        id=rec.id,
        prompt_token_ids=tuple(rec.prompt_token_ids),
        token_ids=tuple(rec.token_ids),
        finish_reason=rec.finish_reason,
        prompt=rec.prompt,
        tokens=tuple(texts) if texts is not None and len(texts) == len(rec.token_ids) else None,
    )


def encode_golden(golden: Trace) -> bytes:
    return encode_trace(golden.header, golden.records)


def check_golden_version(golden: Trace) -> None:
    """A golden names its format version in `golden`; a version this gate does not know is
    refused (exit 2), never read as version 1. A trace without it is no golden."""
    version = golden.header.extra.get("golden")
    if type(version) is not int:
        raise TraceError(
            golden.path,
            1,
            "golden",
            f"must be the golden format version (the integer {GOLDEN_VERSION}), found {version!r}: "
            "is this a golden? (gate goldens record writes one)",
        )
    if version != GOLDEN_VERSION:
        why = f"unsupported golden version {version} (this gate reads version {GOLDEN_VERSION}); re-record it"
        raise TraceError(golden.path, 1, "golden", why)


def check_golden_against_pin(golden: Trace, pin: Pin) -> None:
    """The golden must be of a version this gate reads, of the pin's model and its very
    prompts: same ids, same prompt token ids. Otherwise its tokens answer other questions
    (exit 2)."""
    check_golden_version(golden)
    where = golden.path
    if golden.header.model != pin.model:
        raise InputError(f"{where}: the golden is for model {golden.header.model!r}, the pin for {pin.model!r}")
    pinned = pin.trace.by_id()
    ids = [r.id for r in golden.records]
    missing = [i for i in pinned if i not in set(ids)]
    extra = [i for i in ids if i not in pinned]
    if missing or extra:
        raise InputError(
            f"{where}: its prompts are not the pin's ({pin.folder.pin_path}): not in the golden {missing[:5]}, "
            f"not in the pin {extra[:5]}; re-record it: gate goldens record --force"
        )
    for rec in golden.records:
        if rec.prompt_token_ids != pinned[rec.id].prompt_token_ids:
            raise InputError(
                f"{where}: prompt {rec.id!r}: its prompt token ids differ from the pin's ({pin.folder.pin_path}); "
                "the pin was re-recorded with another tokenizer or template: re-record the golden "
                "(gate goldens record --force)"
            )


def accepted_golden(old: Trace, fresh: Trace, moves: Sequence[GoldenMove]) -> Trace:
    """The golden `--accept` writes: the moved prompts' new records, the others' old ones
    (their tokens did not move), under the new run's header with a note of what moved."""
    moved = {m.prompt_id for m in moves}
    new = fresh.by_id()
    records = tuple(new[r.id] if r.id in moved else r for r in old.records)
    note = {
        "moved": sorted(moved),
        "replaced_created_at": old.header.extra.get("created_at"),
    }
    header = replace(fresh.header, extra={**fresh.header.extra, "accepted": note})
    return Trace(header=header, records=records, path=old.path)
