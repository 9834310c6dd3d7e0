"""The reference capture and the honest band of a diagnosis, kept in gate's cache.

Both depend only on the reference weights, the context, the paths and the settings they were
computed under, never on the candidate; a second diagnosis of the same position (another
candidate, a fixed build of the same one) reads them instead of loading two models and
running them. An entry is a folder under `cache_root()` named by the sha256 of its manifest:

- `manifest.json`: everything the entry depends on: the sha256 of every file at the top of
  the weights folder (weights, config, tokenizer), the honest dtype, the prompt and context
  ids, the paths, gate's version and the sha256 of the source of the modules that compute
  it, torch's, transformers' and numpy's versions, the torch thread count, the CPU ISA torch
  dispatches to (and the variables that force one), the CPU's model name;
- `reference.npz`: the reference capture (float32, no pickles);
- `band.json`: the honest engine's error at each point of each path, and the description of
  the two engines for the record; its sha256 is kept in `reference.npz`, whose zip CRC-32
  covers every byte of it: an entry changed or damaged on disk is a miss.

An entry is read only when its stored manifest equals the one computed now, field by field:
a change of any input is another entry, and an entry of other weights is never read. A
weights folder that is not local (nothing to hash) is never cached. An unreadable entry is a
miss, and computed again. Writes go to a scratch folder moved into place.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from gate.core.diagnosis.capture import Capture, capture_from_arrays, capture_to_arrays
from gate.core.diagnosis.locate import HonestBand
from gate.core.storage.digests import known_sha256
from gate.core.storage.files import file_sha256, gate_cache_dir
from gate.engines.registry import REFERENCE_SOURCES
from gate.version import __version__

# 2: a capture's arrays packed end to end (gate.core.diagnosis.capture.capture_to_arrays);
# 3: the sha256 of band.json kept in reference.npz (a band.json changed on disk is a miss).
FORMAT = 3
MANIFEST = "manifest.json"
REFERENCE = "reference.npz"
BAND = "band.json"
BAND_SHA256 = "band_sha256"  # reference.npz's member: the sha256 of the band.json written with it
# The modules whose code decides what an entry holds: a change to any is another entry.
SOURCES = (
    *REFERENCE_SOURCES,
    "gate.core.diagnosis.capture",
    "gate.core.diagnosis.locate",
    "gate.core.diagnosis.metric",
    "gate.workflows.diagnose.core",
    "gate.workflows.diagnose.cache",
)
# Variables torch and oneDNN read at start-up to choose their kernels (the honest variants of
# gate.workflows.diagnose.variants): another kernel is another band.
ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "OMP_NUM_THREADS")


def cache_root() -> Path:
    """$GATE_DIAGNOSE_CACHE_DIR, else `diagnose` in gate's cache folder."""
    explicit = os.environ.get("GATE_DIAGNOSE_CACHE_DIR")
    return Path(explicit).expanduser() if explicit else gate_cache_dir() / "diagnose"


@dataclass(frozen=True, slots=True)
class Entry:
    """What one entry holds: the reference capture (standing for every path), the honest band
    of each path, and the two engines' descriptions."""

    reference: Capture
    bands: Mapping[str, HonestBand]
    engines: Mapping[str, Any]


def manifest(
    model_path: str,
    honest_dtype: str,
    prompt_ids: Sequence[int],
    context_ids: Sequence[int],
    paths: Sequence[str],
    decode_prompt_ids: Sequence[int] | None = None,
    logits_from: int = 0,
) -> dict[str, Any] | None:
    """The entry's inputs, or None when `model_path` is no local folder (nothing to hash).
    `decode_prompt_ids`: what the decode path prefills before its decode steps (the prompt
    when not given: a step per context token after it); `logits_from`: the first position
    whose lm_head row the reference and the band hold."""
    folder = Path(model_path)
    if not folder.is_dir():
        return None
    import torch
    import transformers

    files = {p.name: known_sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}
    sources = {name: _source_sha256(name) for name in SOURCES}
    return {
        "gate_diagnose_cache": FORMAT,
        "gate": __version__,
        "sources": sources,
        "model_files": files,
        "honest_dtype": honest_dtype,
        "prompt_ids": [int(i) for i in prompt_ids],
        "context_ids": [int(i) for i in context_ids],
        "paths": list(paths),
        "decode_prompt_ids": [int(i) for i in (prompt_ids if decode_prompt_ids is None else decode_prompt_ids)],
        "logits_from": int(logits_from),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "isa_env": {k: os.environ.get(k) for k in ISA_VARIABLES},
        "machine": platform.machine(),
        "cpu": _cpu_model(),
    }


def entry_dir(key: Mapping[str, Any], root: Path | None = None) -> Path:
    digest = hashlib.sha256(orjson.dumps(key, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return (root or cache_root()) / digest[:32]


def read(key: Mapping[str, Any], root: Path | None = None) -> Entry | None:
    """The entry of exactly these inputs, or None (none kept, another's, or unreadable)."""
    folder = entry_dir(key, root)
    try:
        stored = orjson.loads((folder / MANIFEST).read_bytes())
        if stored != orjson.loads(orjson.dumps(key)):
            return None
        raw = (folder / BAND).read_bytes()
        kept = _reference(folder / REFERENCE)
        if kept is None or kept[1] != hashlib.sha256(raw).hexdigest():  # the band as written, byte for byte
            return None
        reference, band = kept[0], orjson.loads(raw)
        bands = {str(p): HonestBand.from_dict(b) for p, b in band["bands"].items()}
        if set(bands) != set(key["paths"]) or any(b.path != p for p, b in bands.items()):
            return None
        return Entry(reference, bands, dict(band["engines"]))
    except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError):
        return None


def _reference(path: Path) -> tuple[Capture, str] | None:
    """The reference capture kept at `path` and the sha256 of the band.json written with it,
    or None for a file that cannot be them. A damaged .npz fails in many ways (numpy's
    EOFError for an empty one, zipfile's BadZipFile for a cut or flipped zip, its CRC-32
    covering every byte of the arrays, NotImplementedError for a flipped version field, ...):
    each is a miss, computed again (tests/workflows/test_diagnose_cache_corrupt.py flips every
    byte)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        return capture_from_arrays(arrays), str(arrays[BAND_SHA256])
    except Exception:  # a file that is not a reference capture, however it fails to be read
        return None


def write(key: Mapping[str, Any], entry: Entry, root: Path | None = None) -> Path:
    """Keep `entry` under `key` (a scratch folder moved into place)."""
    from gate.models.default import build_and_publish

    folder = entry_dir(key, root)

    def build(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        bands = {p: b.to_dict() for p, b in entry.bands.items()}
        band = orjson.dumps({"bands": bands, "engines": dict(entry.engines)})
        arrays = capture_to_arrays(entry.reference)
        with open(tmp / REFERENCE, "wb") as fh:  # the band's sha256 under the zip's CRC-32 with the arrays
            np.savez(fh, allow_pickle=False, **arrays, **{BAND_SHA256: np.array(hashlib.sha256(band).hexdigest())})
        (tmp / BAND).write_bytes(band)
        (tmp / MANIFEST).write_bytes(orjson.dumps(key, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))

    build_and_publish(folder, build)
    return folder


def _source_sha256(module: str) -> str | None:
    spec = importlib.util.find_spec(module)  # found, not imported
    return file_sha256(Path(spec.origin)) if spec is not None and spec.origin else None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
