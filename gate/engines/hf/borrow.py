"""gate diagnose's honest engine on the candidate's own loaded weights, where they are the
checkpoint's bit for bit: no second load, and no second copy in memory (Qwen3.6-35B-A3B in
bfloat16 is 70 GB: two copies do not fit one 141 GB GPU).

The honest engine is a fresh transformers model of the checkpoint's own config, built around
the candidate's parameter tensors (transformers' `from_pretrained(state_dict=...)`: the same
classes, buffers and ties as a load); nothing of the candidate's code runs in it, only its
weights are read. They are lent only when every one of them is the checkpoint's stored value,
checked here before the honest engine is built (`lendable`):
- the candidate is built on the HF engine, in the honest dtype, and its model is a class of
  the transformers package (a subclass of the model's own may load its weights differently);
  the folder it loaded need not be the checkpoint's, its bytes are checked;
- every floating tensor of the checkpoint is stored in that dtype, and every parameter is in
  it (one transformers keeps in float32 is widened from the stored value: not lent);
- every parameter, mapped back to the checkpoint's layout by transformers' own reverse
  conversion (the experts it stacks, the prefixes it renames), is a stored tensor of the same
  dtype and shape, with the same bytes.
Anything else (a quantised or patched weight, a missing one transformers would initialise, a
header that cannot be read) and the honest engine loads the checkpoint itself, as before.
tests/workflows/test_diagnose_borrowed_weights.py checks both, and the honest engine's
captures bit for bit against its own load's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gate.engines.hf.upcast import FLOATING, STORED, read_header

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def lendable(candidate: Any, model_path: str, dtype: torch.dtype) -> dict[str, torch.Tensor] | None:
    """The candidate's parameters by name, when the honest engine (`dtype` on `model_path`)
    may use them as its own; None when any check fails (see the module doc)."""
    model = getattr(candidate, "model", None)
    if not isinstance(model, torch.nn.Module) or not type(model).__module__.startswith("transformers."):
        return None
    if getattr(candidate, "dtype", None) != dtype or dtype not in STORED:
        return None
    stored = _headers(Path(model_path)) if Path(model_path).is_dir() else None
    if stored is None or {d for _, _, _, d, _ in stored.values() if d in FLOATING} != {STORED[dtype]}:
        return None
    params: dict[str, torch.Tensor] = dict(model.named_parameters())
    if not params or any(p.dtype != dtype for p in params.values()):
        return None
    try:
        return params if _all_stored(model, params, stored) else None
    except Exception:  # transformers' reverse mapping failing on a model is only a model not lent
        return None


# name -> (file, start byte, end byte, dtype name, shape)
Stored = dict[str, tuple[Path, int, int, str, list[int]]]


def _headers(folder: Path) -> Stored | None:
    """Every tensor of the folder's safetensors files, its byte range checked against its
    file's size, dtype and shape; None when a header cannot be read or a range is wrong."""
    out: Stored = {}
    for f in sorted(folder.glob("*.safetensors")):
        try:
            size = f.stat().st_size
        except OSError:
            return None
        read = read_header(f)
        if read is None:
            return None
        header, n = read
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (a, b) = entry["dtype"], [int(x) for x in entry["shape"]], entry["data_offsets"]
                a, b = int(a), int(b)
            except (KeyError, TypeError, ValueError):
                return None
            numel = 1
            for x in shape:
                numel *= x
            width = DTYPES[dtype].itemsize if dtype in DTYPES else None
            if width is not None and (not 0 <= a <= b <= size - 8 - n or b - a != numel * width):
                return None
            out[name] = (f, 8 + n + a, 8 + n + b, dtype, shape)
    return out or None


def _all_stored(model: Any, params: dict[str, torch.Tensor], stored: Stored) -> bool:
    """Whether every parameter, in the checkpoint's layout, is a stored tensor bit for bit.
    Checked a decoder layer at a time (the reverse of stacked experts is a copy of the layer's)."""
    from transformers.core_model_loading import revert_weight_conversion

    groups: dict[str, dict[str, torch.Tensor]] = {}
    for name, p in params.items():
        parts = name.split(".")
        cut = parts.index("layers") + 2 if "layers" in parts[:-2] else len(parts)
        groups.setdefault(".".join(parts[:cut]), {})[name] = p
    buffer = bytearray()
    handles: dict[Path, Any] = {}
    try:
        for group in groups.values():
            reverted = revert_weight_conversion(model, group)
            # Every element of the group's parameters is in what is compared, once.
            if sum(t.numel() for t in reverted.values()) != sum(p.numel() for p in group.values()):
                return False
            for name, t in sorted(reverted.items(), key=lambda kv: stored[kv[0]][:2] if kv[0] in stored else ()):
                where = stored.get(name)
                if where is None or not isinstance(t, torch.Tensor):
                    return False
                f, a, b, dtype, shape = where
                if DTYPES.get(dtype) != t.dtype or list(t.shape) != shape:
                    return False
                if len(buffer) < b - a:
                    buffer = bytearray(b - a)
                fh = handles.get(f) or handles.setdefault(f, open(f, "rb"))  # noqa: SIM115  # closed below
                fh.seek(a)
                if fh.readinto(memoryview(buffer)[: b - a]) != b - a:
                    return False
                if b > a and not _same_bytes(buffer, b - a, t):
                    return False
    finally:
        for fh in handles.values():
            fh.close()
    return True


def _same_bytes(buffer: bytearray, n: int, t: torch.Tensor) -> bool:
    """Whether `t`'s bytes are the buffer's first n (compared as 8-byte words where they divide)."""
    word = torch.int64 if n % 8 == 0 else torch.int16 if n % 2 == 0 else torch.uint8
    x = torch.frombuffer(buffer, dtype=word, count=n // word.itemsize)
    y = t.detach().contiguous().reshape(-1).view(torch.uint8).view(word)
    return bool(torch.equal(x.to(y.device), y))


def built_around(model_path: str, weights: dict[str, Any], kwargs: dict[str, Any]) -> Any:
    """The causal LM transformers loads from `model_path`, built around `weights` (its
    parameters by name, as `named_parameters` gives them) instead of the stored ones: the
    class AutoModelForCausalLM picks for the folder's config, that config, its buffers and ties."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.auto_factory import _get_model_class

    config = AutoConfig.from_pretrained(model_path)
    cls = _get_model_class(config, AutoModelForCausalLM._model_mapping)
    text = config.sub_configs.get("text_config", None)
    if text is not None and getattr(cls, "config_class", None) == text:  # a multimodal folder's causal LM
        config = config.get_text_config()
    model = cls.from_pretrained(None, config=config, state_dict=weights, **kwargs)
    model.config.name_or_path = model_path  # as a load from the folder names it
    return model


def load_causal_lm(model_path: str, kwargs: dict[str, Any], lender: Any, dtype: torch.dtype) -> tuple[Any, bool]:
    """The HF engine's model and whether it is built around `lender`'s weights (an engine's,
    where `lendable` finds them the checkpoint's), else loaded from `model_path`."""
    from transformers import AutoModelForCausalLM

    weights = lendable(lender, model_path, dtype) if lender is not None else None
    if weights is not None:
        return built_around(model_path, weights, kwargs), True
    return AutoModelForCausalLM.from_pretrained(model_path, **kwargs), False
