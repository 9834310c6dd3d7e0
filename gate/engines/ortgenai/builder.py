"""ONNX builds of a Hugging Face checkpoint for ONNX Runtime GenAI, cached under gate's cache.

`onnx_model(source, precision)` returns a folder ONNX Runtime GenAI loads (`model.onnx`,
its external data, `genai_config.json`, tokenizer files), built once by ONNX Runtime
GenAI's own model builder:

    python -m onnxruntime_genai.models.builder -i SOURCE -o OUT -p fp32|int4 -e cpu -c CACHE

run as a subprocess (the builder imports torch and transformers and prints progress; a
crash there must not take gate with it), offline (`HF_HUB_OFFLINE=1`: the source is a
local folder). The build lands in a temporary sibling folder that is renamed into place,
with a manifest (`gate-onnx-manifest.json`) of the source's weights and tokenizer hashes,
the precision, the builder's versions and the sha256 of every file produced. Each later
use re-hashes the folder against it (about 1 s for the 540 MB fp32 build of the default
model); a corrupt folder, or one built from other weights, is rebuilt with a message on
stderr.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

from gate.core.storage.files import gate_cache_dir
from gate.errors import EngineError, InputError
from gate.models.default import build_and_publish, read_build_manifest
from gate.models.hashing import source_hashes
from gate.models.listing import check_listed_files, listing_sha256, load_manifest, section
from gate.version import install_line

ONNX_MANIFEST = "gate-onnx-manifest.json"
ONNX_MANIFEST_VERSION = 1
PRECISIONS = ("fp32", "int4")
EXECUTION_PROVIDER = "cpu"
BUILDER_MODULE = "onnxruntime_genai.models.builder"

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"gate: {message}", file=sys.stderr, flush=True)


def onnx_model_dir(source: Path, precision: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the ONNX build of `source` at `precision` lives (built or not)."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else gate_cache_dir() / "models"
    return root / f"{source.name}-onnx-{precision}-{EXECUTION_PROVIDER}"


def onnx_model(
    source: str | os.PathLike[str],
    precision: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    log: Log | None = None,
) -> Path:
    """The ONNX Runtime GenAI folder for `source` (a Hugging Face folder) at `precision`,
    built on first use and checked against its manifest on every later use."""
    if precision not in PRECISIONS:
        raise InputError(f"--engine-opt precision={precision}: expected one of {', '.join(PRECISIONS)}")
    say = log or _stderr
    src = Path(source).expanduser()
    if not (src / "config.json").is_file():
        raise InputError(f"{src}: not a Hugging Face model folder (no config.json) to build an ONNX model from")
    hashes = source_hashes(src)
    target = onnx_model_dir(src, precision, cache_dir)
    if target.exists():
        problem = check_onnx_folder(target, source_weights_sha256=hashes["weights_sha256"])
        if problem is None:
            return target
        say(f"the cached ONNX model at {target} failed its check ({problem}); rebuilding it")
    else:
        say(f"building the ONNX model ({precision}, {EXECUTION_PROVIDER}) of {src} into {target} (once)")
    build_and_publish(target, lambda tmp: _build(src, tmp, precision, hashes))
    problem = check_onnx_folder(target, source_weights_sha256=hashes["weights_sha256"])
    if problem is not None:
        raise EngineError(f"the ONNX model built at {target} does not pass its own check: {problem}")
    return target


def check_onnx_folder(folder: Path, *, source_weights_sha256: str | None = None) -> str | None:
    """None when `folder` holds an intact ONNX build (of those source weights), else why not."""
    manifest = load_manifest(folder, ONNX_MANIFEST, "gate_onnx_manifest", ONNX_MANIFEST_VERSION)
    if isinstance(manifest, str):
        return manifest
    source = section(manifest, "source")
    if source_weights_sha256 is not None and source.get("weights_sha256") != source_weights_sha256:
        return "it was built from other weights than the source folder holds now"
    return check_listed_files(folder, ONNX_MANIFEST, manifest)


def read_onnx_manifest(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The manifest of a folder gate built, or None for a folder built elsewhere."""
    return read_build_manifest(folder, ONNX_MANIFEST)


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("onnxruntime-genai", "onnxruntime", "onnx", "onnx-ir", "transformers", "torch"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def _build(source: Path, out: Path, precision: str, hashes: dict[str, str]) -> None:
    try:
        import onnxruntime_genai  # noqa: F401  (the builder ships inside it)
    except ImportError as exc:
        raise InputError(
            f"building an ONNX model needs the ortgenai extra ({exc}); {install_line('hf,ortgenai')}"
        ) from None
    started = time.monotonic()
    out.mkdir(parents=True)
    scratch = out.parent / f"{out.name}.builder-cache"
    argv = [
        sys.executable,
        "-m",
        BUILDER_MODULE,
        "-i",
        str(source),
        "-o",
        str(out),
        "-p",
        precision,
        "-e",
        EXECUTION_PROVIDER,
        "-c",
        str(scratch),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0 or not (out / "genai_config.json").is_file():
        lines = [ln for ln in (done.stderr or done.stdout or "").splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else f"exit status {done.returncode}"
        raise EngineError(f"ONNX Runtime GenAI's model builder failed on {source} ({precision}): {last}")
    write_manifest(out, precision, {"path": str(source), **hashes}, build_seconds=time.monotonic() - started)


def write_manifest(out: Path, precision: str, source: dict[str, str], *, build_seconds: float = 0.0) -> None:
    """Record every file in `out` (sha256), the precision, the source and the builder's
    versions in `out/ONNX_MANIFEST`, and flush the folder to disk."""
    names = sorted(p.name for p in out.iterdir() if p.is_file() and p.name != ONNX_MANIFEST)
    model_digest, files = listing_sha256(out, names)
    manifest = {
        "gate_onnx_manifest": ONNX_MANIFEST_VERSION,
        "precision": precision,
        "execution_provider": EXECUTION_PROVIDER,
        "source": source,
        "builder": {"module": BUILDER_MODULE, "argv": ["-p", precision, "-e", EXECUTION_PROVIDER], **_versions()},
        "model_sha256": model_digest,
        "files": files,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": round(build_seconds, 1),
    }
    (out / ONNX_MANIFEST).write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    for path in out.iterdir():
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())
