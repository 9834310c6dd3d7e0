"""ExecuTorch programs of a Hugging Face checkpoint, built once and cached under gate's cache.

`executorch_program(source, recipe, max_seq_len)` returns a folder holding `model.pte` and
`gate-executorch-manifest.json`, built on first use by `gate.engines.executorch.export` in
a child process (offline: `HF_HUB_OFFLINE=1`, the source is a local folder), into a
temporary sibling folder renamed into place. The manifest records the source's weights and
tokenizer hashes, the recipe, the sequence length, ExecuTorch's, torch's, torchao's and
transformers' versions, and the program's sha256. Each later use re-hashes the program
against it (well under a second for the default model's 540 MB fp32 build); a corrupt
program, one built from other weights or by another ExecuTorch is rebuilt, with a message on
stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

from gate.core.storage.files import gate_cache_dir
from gate.engines.executorch.export import ATTENTIONS, BACKEND, RECIPES
from gate.errors import EngineError, InputError
from gate.models.default import build_and_publish, read_build_manifest
from gate.models.hashing import source_hashes
from gate.models.listing import check_listed_files, load_manifest, section
from gate.version import install_line

PTE_NAME = "model.pte"
PTE_MANIFEST = "gate-executorch-manifest.json"
PTE_MANIFEST_VERSION = 1
EXPORT_MODULE = "gate.engines.executorch.export"
VERSIONED = ("executorch", "torch", "torchao", "transformers")

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"gate: {message}", file=sys.stderr, flush=True)


def versions() -> dict[str, str]:
    """The installed versions of what an export depends on."""
    out = {}
    for dist in VERSIONED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def program_dir(
    source: Path,
    recipe: str,
    max_seq_len: int,
    cache_dir: str | os.PathLike[str] | None = None,
    attention: str = "masked",
) -> Path:
    """Where the ExecuTorch build of `source` with `recipe` and `attention` lives (built or
    not); the default attention keeps the folder name builds had before there was a choice."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else gate_cache_dir() / "models"
    kind = recipe if attention == "masked" else f"{recipe}-{attention}"
    return root / f"{source.name}-executorch-{kind}-{BACKEND.lower()}-seq{max_seq_len}"


def executorch_program(
    source: str | os.PathLike[str],
    recipe: str,
    max_seq_len: int,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    log: Log | None = None,
    attention: str = "masked",
) -> Path:
    """The folder of the ExecuTorch build of `source`, exported on first use and checked
    against its manifest on every later use."""
    if recipe not in RECIPES:
        raise InputError(f"--engine-opt recipe={recipe}: expected one of {', '.join(RECIPES)}")
    if attention not in ATTENTIONS:
        raise InputError(f"--engine-opt attention={attention}: expected one of {', '.join(ATTENTIONS)}")
    say = log or _stderr
    src = Path(source).expanduser()
    if not (src / "config.json").is_file():
        raise InputError(
            f"{src}: not a Hugging Face model folder (no config.json) to export an ExecuTorch program from"
        )
    hashes = source_hashes(src)
    target = program_dir(src, recipe, max_seq_len, cache_dir, attention)
    if target.exists():
        problem = check_program_folder(target, source_weights_sha256=hashes["weights_sha256"], attention=attention)
        if problem is None:
            return target
        say(f"the cached ExecuTorch program at {target} failed its check ({problem}); exporting it again")
    else:
        what = f"({recipe}, {attention}, {BACKEND})"
        say(f"exporting the ExecuTorch program {what} of {src} into {target} (once, minutes)")
    build_and_publish(target, lambda tmp: _build(src, tmp, recipe, max_seq_len, hashes, attention))
    problem = check_program_folder(target, source_weights_sha256=hashes["weights_sha256"], attention=attention)
    if problem is not None:
        raise EngineError(f"the ExecuTorch program exported at {target} does not pass its own check: {problem}")
    return target


def check_program_folder(
    folder: Path, *, source_weights_sha256: str | None = None, attention: str | None = None
) -> str | None:
    """None when `folder` holds an intact build (of those weights, by this ExecuTorch, with
    that attention: a manifest that names none is `masked`'s, the only one there was), else why not."""
    manifest = load_manifest(folder, PTE_MANIFEST, "gate_executorch_manifest", PTE_MANIFEST_VERSION)
    if isinstance(manifest, str):
        return manifest
    source = section(manifest, "source")
    if source_weights_sha256 is not None and source.get("weights_sha256") != source_weights_sha256:
        return "it was exported from other weights than the source folder holds now"
    built_attention = manifest.get("attention", "masked")
    if attention is not None and built_attention != attention:
        return f"it was exported with attention {built_attention!r}, not {attention!r}"
    built = section(manifest, "versions").get("executorch")
    installed = versions().get("executorch")
    if installed is not None and built != installed:
        return f"it was exported by ExecuTorch {built}, and {installed} is installed"
    return check_listed_files(folder, PTE_MANIFEST, manifest)


def read_program_manifest(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The manifest of a build gate made, or None for a program built elsewhere."""
    return read_build_manifest(folder, PTE_MANIFEST)


def _build(source: Path, out: Path, recipe: str, max_seq_len: int, hashes: dict[str, str], attention: str) -> None:
    try:
        import executorch  # noqa: F401
    except ImportError as exc:
        raise InputError(
            f"exporting an ExecuTorch program needs the executorch extra ({exc}); {install_line('hf,executorch')}"
        ) from None
    out.mkdir(parents=True)
    argv = [sys.executable, "-m", EXPORT_MODULE, str(source), str(out / PTE_NAME), recipe, str(max_seq_len), attention]
    # The child imports this very gate, wherever it was imported from.
    here = str(Path(__file__).resolve().parents[3])
    path = os.environ.get("PYTHONPATH")
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONPATH": here if not path else f"{here}{os.pathsep}{path}",
    }
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    facts: dict[str, Any] = {}
    lines = [ln for ln in (done.stdout or "").splitlines() if ln.strip()]
    if done.returncode == 0 and lines:
        try:
            facts = dict(orjson.loads(lines[-1]))
        except (orjson.JSONDecodeError, TypeError, ValueError):
            facts = {}
    if done.returncode != 0 or not facts or not (out / PTE_NAME).is_file():
        errors = [ln for ln in (done.stderr or done.stdout or "").splitlines() if ln.strip()]
        last = errors[-1].strip() if errors else f"exit status {done.returncode}"
        raise EngineError(f"the ExecuTorch export of {source} ({recipe}) failed: {last}")
    write_manifest(
        out,
        recipe,
        {"path": str(source), **hashes},
        facts,
        build_seconds=time.monotonic() - started,
        attention=attention,
    )


def write_manifest(
    out: Path,
    recipe: str,
    source: dict[str, str],
    facts: dict[str, Any],
    *,
    build_seconds: float = 0.0,
    attention: str = "masked",
) -> None:
    """Record the program's sha256, the recipe, the source and the exporter's versions in
    `out/PTE_MANIFEST`, and flush the folder to disk."""
    from gate.models.listing import listing_sha256

    names = sorted(p.name for p in out.iterdir() if p.is_file() and p.name != PTE_MANIFEST)
    _, files = listing_sha256(out, names)
    manifest = {
        "gate_executorch_manifest": PTE_MANIFEST_VERSION,
        "recipe": recipe,
        "attention": attention,
        "backend": BACKEND,
        "source": source,
        "export": facts,
        "versions": versions(),
        "pte_sha256": files.get(PTE_NAME),
        "files": files,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": round(build_seconds, 1),
    }
    (out / PTE_MANIFEST).write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    for path in out.iterdir():
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())
