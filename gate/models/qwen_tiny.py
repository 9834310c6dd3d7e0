"""gate's Qwen3.6 test checkpoint, `gate-llm/Qwen3.6-tiny`: a few-MB model of Qwen/Qwen3.6-35B-A3B's
architecture (Gated DeltaNet + gated attention, MoE with a shared expert, MTP, a vision tower),
shipped inside the package like the default model's pin, with its engine conversions in gate's cache.

The checkpoint is `gate/_data/models/Qwen3.6-tiny/` (built by scripts/build_qwen36_test_model.py,
committed, checked against its manifest on every use). Its GGUF (llama.cpp's converter) lives in
`$GATE_CACHE_DIR/models/Qwen3.6-tiny-gguf/` with a manifest naming the checkpoint's weights hash:
the script's `convert` step writes it, and an engine that needs it and finds none says so.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import orjson

from gate.core.storage.files import file_sha256, gate_cache_dir
from gate.errors import InputError
from gate.models.listing import check_listed_files, listing_sha256, load_manifest, tokenizer_files, weight_files

QWEN_TINY = "gate-llm/Qwen3.6-tiny"
FOLDER = "Qwen3.6-tiny"
MANIFEST = "gate-manifest.json"
MANIFEST_VERSION = 1
GGUF_MANIFEST = "gate-gguf-manifest.json"
GGUF_NAME = "Qwen3.6-tiny-BF16.gguf"
BUILD_SCRIPT = "scripts/build_qwen36_test_model.py"


def packaged_dir() -> Path:
    """Where the checkpoint lives in the package (whether or not it is there)."""
    return Path(__file__).resolve().parent.parent / "_data" / "models" / FOLDER


def qwen_tiny_dir() -> Path:
    """The checkpoint's folder, checked against its manifest; a missing or altered folder is
    an input error naming the file at fault."""
    folder = packaged_dir()
    problem = check_folder(folder)
    if problem is not None:
        raise InputError(
            f"the test checkpoint {QWEN_TINY} at {folder} failed its check ({problem}); "
            f"restore it from git, or rebuild it with python {BUILD_SCRIPT} build --force"
        )
    return folder


def check_folder(folder: Path) -> str | None:
    manifest = load_manifest(folder, MANIFEST, "gate_model_manifest", MANIFEST_VERSION)
    if isinstance(manifest, str):
        return manifest
    return check_listed_files(folder, MANIFEST, manifest)


def write_manifest(folder: Path, source: dict[str, Any]) -> None:
    """The sha256 of every file in `folder`, the weights and tokenizer digests and how it was built."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != MANIFEST)
    weights, _ = listing_sha256(folder, weight_files(folder))
    tokenizer, _ = listing_sha256(folder, tokenizer_files(folder))
    _, files = listing_sha256(folder, names)
    manifest = {
        "gate_model_manifest": MANIFEST_VERSION,
        "model": QWEN_TINY,
        "dtype": "bfloat16",
        "source": source,
        "weights_sha256": weights,
        "tokenizer_sha256": tokenizer,
        "files": files,
    }
    (folder / MANIFEST).write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))


def weights_digest(folder: Path) -> str:
    return listing_sha256(folder, weight_files(folder))[0]


# --------------------------------------------------------------------------- its GGUF


def gguf_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    root = Path(cache_dir).expanduser() if cache_dir is not None else gate_cache_dir() / "models"
    return root / f"{FOLDER}-gguf"


def gguf_path() -> Path:
    """The checkpoint's GGUF, built by the script's `convert` step from exactly the committed
    weights; anything else is refused in one line that says how to build it."""
    folder = gguf_dir()
    manifest = load_manifest(folder, GGUF_MANIFEST, "gate_gguf_manifest", MANIFEST_VERSION)
    how = f"build it with: python {BUILD_SCRIPT} convert"
    if isinstance(manifest, str):
        raise InputError(f"the GGUF of {QWEN_TINY} is not built in {folder} ({manifest}); {how}")
    if manifest.get("source_weights_sha256") != weights_digest(qwen_tiny_dir()):
        raise InputError(f"the GGUF of {QWEN_TINY} in {folder} was made from other weights than gate ships; {how}")
    problem = check_listed_files(folder, GGUF_MANIFEST, manifest)
    if problem is not None:
        raise InputError(f"the GGUF of {QWEN_TINY} in {folder} failed its check ({problem}); {how}")
    return folder / GGUF_NAME


def publish_gguf(built: Path, source: Path, converter: str) -> Path:
    """Move a converted GGUF into gate's cache beside its manifest (atomically: a scratch
    folder renamed into place)."""
    target = gguf_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
    tmp.mkdir()
    try:
        shutil.move(str(built), tmp / GGUF_NAME)
        manifest = {
            "gate_gguf_manifest": MANIFEST_VERSION,
            "model": QWEN_TINY,
            "converter": converter,
            "source_weights_sha256": weights_digest(source),
            "files": {GGUF_NAME: file_sha256(tmp / GGUF_NAME)},
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (tmp / GGUF_MANIFEST).write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target / GGUF_NAME
