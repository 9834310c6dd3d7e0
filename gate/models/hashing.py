"""Hashes of a model folder's weights and tokenizer, for pin provenance.

The digests are computed by `gate.models.listing` (a `sha256sum`-style listing of the
files); this module finds the folder a model id names (a path, the embedded default, or a
snapshot already in the Hugging Face cache) and hashes it.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from gate.errors import InputError
from gate.models.default import DEFAULT_MODEL, materialize_default
from gate.models.default import MANIFEST as DEFAULT_MANIFEST
from gate.models.listing import listing_sha256, tokenizer_files, weight_files


def local_model_dir(model: str | os.PathLike[str]) -> Path | None:
    """The local folder holding `model`: a path as given, the default model's materialised
    folder, or a snapshot already in the Hugging Face cache. None when there is none
    (nothing is downloaded)."""
    candidate = Path(model).expanduser()
    if candidate.is_dir():
        return candidate
    if str(model) == DEFAULT_MODEL:
        return materialize_default()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(model), local_files_only=True))
    except Exception:  # not cached, not a repo id, or huggingface_hub missing
        return None


def weights_sha256(path: str | os.PathLike[str]) -> str | None:
    """Digest of the model's weight files (see the module doc), or None when not local."""
    folder = local_model_dir(path)
    if folder is None:
        return None
    names = weight_files(folder)
    return listing_sha256(folder, names)[0] if names else None


def tokenizer_sha256(path: str | os.PathLike[str]) -> str | None:
    """Digest of the model's tokenizer and chat-template files, or None when not local."""
    folder = local_model_dir(path)
    if folder is None:
        return None
    names = tokenizer_files(folder)
    return listing_sha256(folder, names)[0] if names else None


def source_hashes(source: Path) -> dict[str, str]:
    """The weights and tokenizer digests of a Hugging Face folder: from gate's manifest when
    the folder is one gate built (the default model), else hashed here."""
    manifest = source / DEFAULT_MANIFEST
    if manifest.is_file():
        try:
            recorded = orjson.loads(manifest.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            recorded = {}
        if isinstance(recorded, dict) and all(isinstance(recorded.get(k), str) for k in ("weights_sha256",)):
            out = {"weights_sha256": str(recorded["weights_sha256"])}
            if isinstance(recorded.get("tokenizer_sha256"), str):
                out["tokenizer_sha256"] = str(recorded["tokenizer_sha256"])
            return out
    weights = weight_files(source)
    if not weights:
        raise InputError(f"{source}: no weight files (.safetensors, .bin) to build a model from")
    out = {"weights_sha256": listing_sha256(source, weights)[0]}
    tok = tokenizer_files(source)
    if tok:
        out["tokenizer_sha256"] = listing_sha256(source, tok)[0]
    return out
