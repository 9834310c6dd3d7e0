"""MLX-quantised builds of a model folder, made by mlx-lm's own quantisation, cached under gate's cache.

`mlx_quantised(source, bits, group_size)` returns a folder `mlx_lm.load` loads: the model
quantised by `mlx_lm.convert(..., quantize=True, q_bits=bits, q_group_size=group_size)`
(affine quantisation, mlx-lm's default mode: every linear layer and the embedding whose
input width the group size divides), its config with the `quantization` entry, the
tokenizer and generation config. It is built once, offline (the source is a local folder),
into a temporary sibling folder renamed into place, with a manifest
(`gate-mlx-manifest.json`) of the source's weights and tokenizer hashes, the quantisation,
mlx's and mlx-lm's versions and the sha256 of every file produced. Each later use re-hashes
the folder against it; a corrupt folder, or one built from other weights, is rebuilt with
a message on stderr.
"""

from __future__ import annotations

import contextlib
import io
import os
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

MLX_MANIFEST = "gate-mlx-manifest.json"
MLX_MANIFEST_VERSION = 1
QUANT_BITS = (2, 3, 4, 5, 6, 8)  # affine quantisation's widths in MLX
QUANT_MODE = "affine"
DEFAULT_GROUP_SIZE = 64  # mlx-lm's default for affine quantisation
GROUP_SIZES = (32, 64, 128)

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"gate: {message}", file=sys.stderr, flush=True)


def mlx_model_dir(
    source: Path, bits: int, group_size: int, dtype: str | None, cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Where the MLX build of `source` with these settings lives (built or not)."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else gate_cache_dir() / "models"
    suffix = f"-{dtype}" if dtype else ""
    return root / f"{source.name}-mlx-q{bits}-g{group_size}{suffix}"


def mlx_quantised(
    source: str | os.PathLike[str],
    bits: int,
    group_size: int = DEFAULT_GROUP_SIZE,
    *,
    dtype: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    log: Log | None = None,
) -> Path:
    """The MLX folder of `source` quantised to `bits` with `group_size`, built on first use
    and checked against its manifest on every later use. `dtype` casts the unquantised
    weights (and the scales) first, as `mlx_lm.convert --dtype` does; None keeps the source's."""
    if bits not in QUANT_BITS:
        raise InputError(f"--engine-opt quantize={bits}: expected one of {', '.join(map(str, QUANT_BITS))} (bits)")
    if group_size not in GROUP_SIZES:
        raise InputError(f"--engine-opt q_group_size={group_size}: expected one of {', '.join(map(str, GROUP_SIZES))}")
    say = log or _stderr
    src = Path(source).expanduser()
    if not (src / "config.json").is_file():
        raise InputError(f"{src}: not a model folder (no config.json) to quantise with mlx-lm")
    target = mlx_model_dir(src, bits, group_size, dtype, cache_dir)
    what = f"MLX {bits}-bit build (group size {group_size}) of {src}"
    return _cached(src, target, bits, group_size, dtype, ("MLX build", f"building the {what}"), say)


def mlx_converted(
    source: str | os.PathLike[str],
    *,
    dtype: str = "bfloat16",
    cache_dir: str | os.PathLike[str] | None = None,
    log: Log | None = None,
) -> Path:
    """The MLX folder of `source` converted unquantised by `mlx_lm.convert` at `dtype`, built on
    first use and checked against its manifest on every later use."""
    say = log or _stderr
    src = Path(source).expanduser()
    if not (src / "config.json").is_file():
        raise InputError(f"{src}: not a model folder (no config.json) to convert with mlx-lm")
    root = Path(cache_dir).expanduser() if cache_dir is not None else gate_cache_dir() / "models"
    target = root / f"{src.name}-mlx-{dtype}"
    names = ("MLX conversion", f"converting {src} with mlx-lm ({dtype})")
    return _cached(src, target, None, DEFAULT_GROUP_SIZE, dtype, names, say)


def _cached(
    src: Path, target: Path, bits: int | None, group_size: int, dtype: str | None, names: tuple[str, str], say: Log
) -> Path:
    """`target`, the build of `src` (`names`: what it is called, what building it is called),
    kept when it passes its check, else built (atomically) and checked."""
    what, doing = names
    hashes = source_hashes(src)
    if target.exists():
        problem = check_mlx_folder(target, source_weights_sha256=hashes["weights_sha256"])
        if problem is None:
            return target
        say(f"the cached {what} at {target} failed its check ({problem}); rebuilding it")
    else:
        say(f"{doing} into {target} (once)")
    build_and_publish(target, lambda tmp: _build(src, tmp, bits, group_size, dtype, hashes))
    problem = check_mlx_folder(target, source_weights_sha256=hashes["weights_sha256"])
    if problem is not None:
        raise EngineError(f"the {what} at {target} does not pass its own check: {problem}")
    return target


def check_mlx_folder(folder: Path, *, source_weights_sha256: str | None = None) -> str | None:
    """None when `folder` holds an intact MLX build (of those source weights), else why not."""
    manifest = load_manifest(folder, MLX_MANIFEST, "gate_mlx_manifest", MLX_MANIFEST_VERSION)
    if isinstance(manifest, str):
        return manifest
    source = section(manifest, "source")
    if source_weights_sha256 is not None and source.get("weights_sha256") != source_weights_sha256:
        return "it was built from other weights than the source folder holds now"
    return check_listed_files(folder, MLX_MANIFEST, manifest)


def read_mlx_manifest(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The manifest of a folder gate built, or None for a folder built elsewhere."""
    return read_build_manifest(folder, MLX_MANIFEST)


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("mlx", "mlx-lm", "mlx-cpu", "mlx-metal", "transformers"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def _build(
    source: Path, out: Path, bits: int | None, group_size: int, dtype: str | None, hashes: dict[str, str]
) -> None:
    try:
        from mlx_lm.convert import convert
    except ImportError as exc:
        raise InputError(f"an MLX build needs the mlx extra ({exc}); {install_line('mlx')}") from None
    started = time.monotonic()
    # mlx-lm prints its progress ("[INFO] Quantizing"); gate's stdout carries data only.
    chatter = io.StringIO()
    try:
        with contextlib.redirect_stdout(chatter):
            convert(
                str(source),
                mlx_path=str(out),
                quantize=bits is not None,
                q_bits=bits or 4,
                q_group_size=group_size,
                q_mode=QUANT_MODE,
                dtype=dtype,
            )
    except Exception as exc:
        text = " ".join(str(exc).split())
        raise EngineError(f"mlx-lm could not convert {source}: {type(exc).__name__}: {text}") from None
    # mlx-lm's model card names no source for a local folder; gate's manifest does.
    with contextlib.suppress(OSError):
        (out / "README.md").unlink()
    write_manifest(
        out,
        {"bits": bits, "group_size": group_size, "mode": QUANT_MODE, "dtype": dtype}
        if bits is not None
        else {"bits": None, "dtype": dtype},
        {"path": str(source), **hashes},
        build_seconds=time.monotonic() - started,
    )


def write_manifest(
    out: Path, quantisation: dict[str, Any], source: dict[str, str], *, build_seconds: float = 0.0
) -> None:
    """Record every file in `out` (sha256), the quantisation, the source and the builder's
    versions in `out/MLX_MANIFEST`, and flush the folder to disk."""
    names = sorted(p.name for p in out.iterdir() if p.is_file() and p.name != MLX_MANIFEST)
    model_digest, files = listing_sha256(out, names)
    manifest = {
        "gate_mlx_manifest": MLX_MANIFEST_VERSION,
        "quantisation": quantisation,
        "source": source,
        "builder": {
            "function": f"mlx_lm.convert.convert(quantize={quantisation.get('bits') is not None})",
            **_versions(),
        },
        "model_sha256": model_digest,
        "files": files,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": round(build_seconds, 1),
    }
    (out / MLX_MANIFEST).write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    for path in out.iterdir():
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())
