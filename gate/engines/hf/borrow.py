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
  conversion (the prefixes it renames; the experts it stacks, as views of their rows where the
  conversion is its stacking), is a stored tensor of the same dtype and shape, with the same
  bytes, read through a mapping of the file.
Anything else (a quantised or patched weight, a missing one transformers would initialise, a
header that cannot be read) and the honest engine loads the checkpoint itself, as before.
tests/workflows/test_diagnose_borrowed_weights.py checks both, and the honest engine's
captures bit for bit against its own load's.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
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
    Checked a decoder layer at a time; an MoE block's stacked experts by views of their rows
    (`_expert_rows`), every other parameter through transformers' reverse mapping (whose
    reverse of the experts is a copy of them). The files are mapped into memory (the page
    cache's own pages, as a safetensors load reads them: no copy of the stored bytes; a
    private mapping, never written, a layer's pages let go once compared)."""
    from transformers.core_model_loading import revert_weight_conversion

    groups: dict[str, dict[str, torch.Tensor]] = {}
    for name, p in params.items():
        parts = name.split(".")
        cut = parts.index("layers") + 2 if "layers" in parts[:-2] else len(parts)
        groups.setdefault(".".join(parts[:cut]), {})[name] = p
    conversions = _conversions(model)
    maps: dict[Path, mmap.mmap] = {}
    try:
        for group in groups.values():
            reverted: dict[str, torch.Tensor] = {}
            others: dict[str, torch.Tensor] = {}
            for name, p in group.items():
                rows = _expert_rows(model, conversions, name, p)
                if rows is None:
                    others[name] = p
                else:
                    reverted.update(rows)
            if others:
                reverted.update(revert_weight_conversion(model, others))
            # Every element of the group's parameters is in what is compared, once.
            if sum(t.numel() for t in reverted.values()) != sum(p.numel() for p in group.values()):
                return False
            spans: dict[Path, tuple[int, int]] = {}
            for name, t in sorted(reverted.items(), key=lambda kv: stored[kv[0]][:2] if kv[0] in stored else ()):
                where = stored.get(name)
                if where is None or not isinstance(t, torch.Tensor):
                    return False
                f, a, b, dtype, shape = where
                if DTYPES.get(dtype) != t.dtype or list(t.shape) != shape:
                    return False
                if b == a:
                    continue
                if f not in maps:
                    with open(f, "rb") as fh:
                        maps[f] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
                if b > len(maps[f]) or not _same_bytes(maps[f], a, b - a, t):
                    return False
                lo, hi = spans.get(f, (a, b))
                spans[f] = (min(lo, a), max(hi, b))
            for f, (lo, hi) in spans.items():  # read once: out of the resident set (the page cache keeps them)
                start = lo - lo % mmap.PAGESIZE
                if hasattr(mmap, "MADV_DONTNEED"):  # not on Windows
                    maps[f].madvise(mmap.MADV_DONTNEED, start, hi - start)
    finally:
        for mapped in maps.values():
            mapped.close()
    return True


def _conversions(model: Any) -> list[Any]:
    """The weight conversions transformers applied loading `model` (or would: its mapping)."""
    found = getattr(model, "_weight_conversions", None)
    if found is None:
        from transformers.conversion_mapping import get_model_conversion_mapping

        found = get_model_conversion_mapping(model, add_legacy=False)
    return list(found or [])


def _expert_rows(model: Any, conversions: list[Any], name: str, p: torch.Tensor) -> dict[str, torch.Tensor] | None:
    """The stored tensors a stacked experts parameter comes from, by stored name, as views of
    its rows (no copy): where its conversion is transformers' stacking of per-expert weights
    (`MergeModulelist(dim=0)`, then `Concatenate(dim=1)` of the K projections it fuses, as
    qwen2_moe's mapping fuses gate_proj and up_proj), expert e's k-th projection is rows
    [k A/K, (k+1) A/K) of p[e] (p: [experts, A, B]), named as transformers' own reverse names
    it (run on a meta tensor: names and shapes, no data). None for any other parameter or
    anything unexpected (the reverse mapping then checks it)."""
    import re

    from transformers.core_model_loading import (
        Concatenate,
        MergeModulelist,
        WeightConverter,
        revert_weight_conversion,
    )

    if p.ndim != 3 or not p.is_contiguous():
        return None
    conv = next(
        (
            c
            for c in conversions
            if isinstance(c, WeightConverter)
            and len(c.target_patterns) == 1
            and "*" not in c.target_patterns[0]
            and name.endswith("." + c.target_patterns[0])
        ),
        None,
    )
    if conv is None:
        return None
    kinds = [(type(op), getattr(op, "dim", None), getattr(op, "num_shards_attribute", None)) for op in conv.operations]
    sources = list(conv.source_patterns)
    merged = [(MergeModulelist, 0, None)]
    stacked = kinds == merged and len(sources) == 1
    fused = kinds == [*merged, (Concatenate, 1, None)] and len(sources) > 1
    if not (stacked or fused):
        return None
    experts, width, cols = p.shape
    k_count = len(sources)
    if width % k_count:
        return None
    part = width // k_count
    patterns = [re.compile(re.escape(s).replace(r"\*", r"(\d+)") + "$") for s in sources]
    names = revert_weight_conversion(model, {name: torch.empty(p.shape, dtype=p.dtype, device="meta")})
    rows = p.view(experts * width, cols)
    out: dict[str, torch.Tensor] = {}
    for stored_name, t in names.items():
        hit = next(((k, m) for k, pat in enumerate(patterns) if (m := pat.search(stored_name))), None)
        if hit is None or not isinstance(t, torch.Tensor) or list(t.shape) != [part, cols]:
            return None
        k, m = hit
        e = int(m.group(1))
        if not 0 <= e < experts or stored_name in out:
            return None
        out[stored_name] = rows[e * width + k * part : e * width + (k + 1) * part]
    return out if len(out) == experts * k_count else None


def _same_bytes(mapped: mmap.mmap, offset: int, n: int, t: torch.Tensor) -> bool:
    """Whether `t`'s bytes are the n at `offset` of `mapped` (compared as 8-byte words where
    they divide). The view of the mapping is gone when this returns (a mapping with a live
    view cannot be closed)."""
    word = torch.int64 if n % 8 == 0 else torch.int16 if n % 2 == 0 else torch.uint8
    y = t.detach().contiguous().reshape(-1).view(torch.uint8).view(word)
    x = torch.frombuffer(mapped, dtype=word, count=n // word.itemsize, offset=offset)
    try:
        return bool(torch.equal(x.to(y.device), y))
    finally:
        del x


def _config(model_path: str) -> Any:
    """The folder's config as `AutoConfig.from_pretrained` reads it (the same dict, class and
    path), without the text of the whole config that its `from_dict` formats for a log line (a
    third of a tiny model's build); AutoConfig itself for anything else (remote code, a type it
    remaps or cannot map, a key it would set)."""
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_dict, unused = PretrainedConfig.get_config_dict(model_path, _from_auto=True, name_or_path=model_path)
    model_type = config_dict.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING or model_type == "mistral":
        return AutoConfig.from_pretrained(model_path)
    if "auto_map" in config_dict or set(unused) - {"_from_auto", "name_or_path"}:
        return AutoConfig.from_pretrained(model_path)
    with _terse_config_reprs():
        return CONFIG_MAPPING[model_type](**{**config_dict, "name_or_path": model_path})


@contextmanager
def _terse_config_reprs() -> Iterator[None]:
    """Configs' repr as a class name and an address while a config is built: huggingface_hub's
    strict fields try the members of a union in turn, and on a sub-config (`text_config: dict
    | PreTrainedConfig | None`) the `dict` member's failure formats the whole config's text
    into a message it then drops, 4 times per Qwen3.6 config (0.9 ms each: most of its
    build). A config whose fields fail every member still fails, named by class."""
    from transformers import PretrainedConfig

    own = PretrainedConfig.__dict__.get("__repr__")
    if own is None:  # a transformers whose base config defines no repr of its own: nothing to make terse
        yield
        return
    PretrainedConfig.__repr__ = object.__repr__  # type: ignore[method-assign]
    try:
        yield
    finally:
        PretrainedConfig.__repr__ = own  # type: ignore[method-assign]


def built_around(model_path: str, weights: dict[str, Any], kwargs: dict[str, Any]) -> Any:
    """The causal LM transformers loads from `model_path`, built around `weights` (its
    parameters by name, as `named_parameters` gives them) instead of the stored ones: the
    class AutoModelForCausalLM picks for the folder's config, that config, its buffers and ties."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.auto_factory import _get_model_class

    config = _config(model_path)
    cls = _get_model_class(config, AutoModelForCausalLM._model_mapping)
    text = config.sub_configs.get("text_config", None)
    if text is not None and getattr(cls, "config_class", None) == text:  # a multimodal folder's causal LM
        config = config.get_text_config()
    with _loading_in_this_thread(), _without_torch_initialisers():
        model = cls.from_pretrained(None, config=config, state_dict=weights, **kwargs)
    model.config.name_or_path = model_path  # as a load from the folder names it
    return model


ASYNC_OFF = "HF_DEACTIVATE_ASYNC_LOAD"


@contextmanager
def _loading_in_this_thread() -> Iterator[None]:
    """transformers' own switch for loading without its thread pool (HF_DEACTIVATE_ASYNC_LOAD),
    for a state dict already in memory: its threads would read nothing from a file, and
    cost a task each per tensor."""
    before = os.environ.get(ASYNC_OFF)
    os.environ[ASYNC_OFF] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ASYNC_OFF, None)
        else:
            os.environ[ASYNC_OFF] = before


@contextmanager
def _without_torch_initialisers() -> Iterator[None]:
    """transformers' own `no_init_weights` (its DeepSpeed path's) around a build on lent
    weights: the modules' torch initialisers (a Linear's kaiming_uniform_) would fill meta
    tensors that the lent weights then replace (a tenth of the tiny Qwen3.6's build). What
    transformers initialises itself after the load (the buffers a state dict does not hold:
    its `_init_weights`, through its own initialisers) is as before; every parameter is lent."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # a transformers without it: its build as it is
        yield
        return
    with no_init_weights():
        yield


def load_causal_lm(model_path: str, kwargs: dict[str, Any], lender: Any, dtype: torch.dtype) -> tuple[Any, bool]:
    """The HF engine's model and whether it is built around `lender`'s weights (an engine's,
    where `lendable` finds them the checkpoint's), else loaded from `model_path`."""
    from transformers import AutoModelForCausalLM

    weights = lendable(lender, model_path, dtype) if lender is not None else None
    if weights is not None:
        return built_around(model_path, weights, kwargs), True
    return AutoModelForCausalLM.from_pretrained(model_path, **kwargs), False
