"""Digests of a model folder's files: the listing format behind the weights and tokenizer hashes.

Both digests are the sha256 of a `sha256sum`-style listing: one line per file,
`<hex sha256>  <name>\\n`, lines sorted by name. So the digest of a folder can be checked
by hand with `sha256sum NAMES | sort -k2 | sha256sum`, and adding, removing or renaming a
file changes it as surely as changing a byte. Files are read in 1 MiB chunks: a 70 GB
checkpoint hashes in constant memory; each file's digest is kept in gate's cache while `stat`
says it is the file hashed (gate.core.storage.digests), so a build's check on every use does
not read its weights again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from gate.core.storage.digests import known_sha256

CHUNK = 1 << 20

# Weight formats in order of preference; the first one present is hashed. Safetensors is
# what gate writes and what vLLM prefers; the others only so a folder without it still
# has provenance.
WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".bin", ".pt", ".gguf")

# Every file that can change the token ids a prompt becomes, chat template included.
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
)


def listing_sha256(folder: Path, names: Iterable[str]) -> tuple[str, dict[str, str]]:
    """(digest of the listing, {name: file sha256}) for `names` inside `folder`."""
    per_file = {name: known_sha256(folder / name) for name in sorted(set(names))}
    listing = "".join(f"{sha}  {name}\n" for name, sha in per_file.items())
    return hashlib.sha256(listing.encode("utf-8")).hexdigest(), per_file


def weight_files(folder: Path) -> list[str]:
    """Names of the weight files at the top of `folder`: the first format present."""
    for suffix in WEIGHT_SUFFIXES:
        names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name.endswith(suffix))
        if names:
            return names
    return []


def tokenizer_files(folder: Path) -> list[str]:
    return sorted(name for name in TOKENIZER_FILES if (folder / name).is_file())


def load_manifest(folder: Path, name: str, version_key: str, version: int) -> dict[str, Any] | str:
    """The manifest file `name` that gate wrote into `folder` (its `version_key` equal to
    `version`), or why it cannot be used."""
    try:
        manifest = orjson.loads((folder / name).read_bytes())
    except FileNotFoundError:
        return f"no {name}"
    except (OSError, orjson.JSONDecodeError) as exc:
        return f"unreadable {name}: {exc}"
    if not isinstance(manifest, dict) or manifest.get(version_key) != version:
        return f"{name} is not a version-{version} manifest"
    return manifest


def section(manifest: dict[str, Any], key: str) -> dict[str, Any]:
    """The manifest's object `key` (a build's `source`, its `versions`), empty when it has none
    or holds something else: a manifest damaged on disk is a folder to rebuild, not an error."""
    value = manifest.get(key)
    return value if isinstance(value, dict) else {}


def check_listed_files(folder: Path, name: str, manifest: dict[str, Any]) -> str | None:
    """None when every file the manifest `name` lists is in `folder` with its sha256, else
    the first that is not."""
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return f"{name} lists no files"
    for fname, expected in sorted(files.items()):
        path = folder / fname
        if not path.is_file():
            return f"{fname} is missing"
        if known_sha256(path) != expected:
            return f"{fname} does not match its sha256"
    return None
