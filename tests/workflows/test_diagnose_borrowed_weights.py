"""gate diagnose's honest engine on the candidate's loaded weights (gate.engines.hf.borrow):
lent only where every one is the checkpoint's stored value bit for bit, and then the honest
engine and the reference it widens to are their own loads bit for bit, at every capture point
of both paths, holding no copy of their own; any weight that is not the checkpoint's (altered
in place behind autograd's back, one of 256 experts, an extra parameter), another dtype, folder
or model class, and the honest engine loads the checkpoint itself: a candidate gains nothing
from its weights by lending them."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

PROMPT = (3, 17, 42, 8, 99, 5)
CONTEXT = (*PROMPT, 11, 23, 61, 7, 30)


@pytest.fixture(scope="module")
def threads() -> Iterator[None]:
    from helpers.tiny_pin import one_thread

    with one_thread():
        yield


def builders() -> dict[str, Callable[[Path], Path]]:
    from helpers.tiny_models import architectures

    return architectures(seed=4)


def candidate(folder: Path, dtype: str = "bfloat16") -> Any:
    from gate.engines.hf.engine import HFEngine

    return HFEngine(str(folder), tokenizer=False, dtype=dtype)


def lent(eng: Any, folder: Path) -> dict[str, Any] | None:
    import torch

    from gate.engines.hf.borrow import lendable

    return lendable(eng, str(folder), torch.bfloat16)


def same(a: Any, b: Any) -> None:
    import numpy as np

    assert [t.point for t in a.tensors] == [t.point for t in b.tensors] and len(a.tensors) > 10
    for x, y in zip(a.tensors, b.tensors, strict=True):
        assert x.positions == y.positions and np.array_equal(x.values, y.values), x.point.module


@pytest.mark.parametrize("arch", ["llama", "qwen3-moe", "qwen3.5-moe-hybrid", "qwen3.5-moe-256"])
def test_an_honest_engine_on_lent_weights_is_its_own_load_bit_for_bit(
    tiny_models_dir: Path, threads: None, arch: str
) -> None:
    import torch

    from gate.core.diagnosis.capture import PREFILL
    from gate.workflows.diagnose.core import load_hf

    folder = builders()[arch](tiny_models_dir / f"borrow-{arch}")
    cand = candidate(folder)
    with torch.inference_mode():
        before = cand.model(input_ids=torch.tensor([list(CONTEXT)])).logits
    weights = lent(cand, folder)
    assert weights is not None
    borrowed, loaded = load_hf(str(folder), "bfloat16", cand), load_hf(str(folder), "bfloat16")
    assert borrowed.borrowed and not loaded.borrowed
    assert type(borrowed.model) is type(loaded.model)
    assert borrowed.model.config.to_dict() == loaded.model.config.to_dict()
    theirs = {p.data_ptr() for p in cand.model.parameters()}
    assert all(p.data_ptr() in theirs for p in borrowed.model.parameters())  # no copy of its own
    for (name, x), (_, y) in zip(borrowed.model.named_buffers(), loaded.model.named_buffers(), strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y), name
    a = borrowed.capture_paths_shared(CONTEXT[:-1], CONTEXT, logits_from=len(CONTEXT) - 2)
    b = loaded.capture_paths_shared(CONTEXT[:-1], CONTEXT, logits_from=len(CONTEXT) - 2)
    for path in a:
        same(a[path], b[path])
    # The reference it widens to: the widened load's, bit for bit.
    assert borrowed.widens_exactly() and loaded.widens_exactly()
    borrowed.widen()
    loaded.widen()
    same(
        borrowed.capture_path(PROMPT, CONTEXT, PREFILL, logits_from=0),
        loaded.capture_path(PROMPT, CONTEXT, PREFILL, logits_from=0),
    )
    borrowed.close()
    loaded.close()
    with torch.inference_mode():  # the candidate's weights as they were
        assert torch.equal(cand.model(input_ids=torch.tensor([list(CONTEXT)])).logits, before)
    assert all(p.dtype == torch.bfloat16 for p in cand.model.parameters())


def altered(name: str) -> Callable[[Any], None]:
    """A change to a loaded candidate's model that leaves it runnable."""
    import torch

    def expert(eng: Any, which: str, index: int) -> None:
        experts = next(m for m in eng.model.modules() if type(m).__name__.endswith("Experts"))
        getattr(experts, which).data[index, 0, 0] += 1.0  # `.data`: no version counter sees it

    def extra(eng: Any) -> None:
        eng.model.model.norm.register_parameter("extra", torch.nn.Parameter(torch.ones(2, dtype=torch.bfloat16)))

    def subclass(eng: Any) -> None:
        eng.model.__class__ = type("Patched", (type(eng.model),), {"__module__": "my_engine"})

    return {
        "one weight, in place": lambda eng: eng.model.model.norm.weight.data.add_(0.5),
        "the first expert's gate": lambda eng: expert(eng, "gate_up_proj", 0),
        "the last expert's down projection": lambda eng: expert(eng, "down_proj", -1),
        "a parameter the checkpoint lacks": extra,
        "a model class of its own": subclass,
    }[name]


@pytest.mark.parametrize(
    "change",
    [
        "one weight, in place",
        "the first expert's gate",
        "the last expert's down projection",
        "a parameter the checkpoint lacks",
        "a model class of its own",
    ],
)
def test_weights_that_are_not_the_checkpoints_are_not_lent(tiny_models_dir: Path, threads: None, change: str) -> None:
    folder = builders()["qwen3.5-moe-256"](tiny_models_dir / "borrow-qwen3.5-moe-256")
    eng = candidate(folder)
    assert lent(eng, folder) is not None
    altered(change)(eng)
    assert lent(eng, folder) is None


def test_another_dtype_folder_or_engine_is_not_lent(tiny_models_dir: Path, threads: None) -> None:
    import torch
    from helpers.tiny_models import build_tiny_llama

    from gate.engines.hf.borrow import lendable

    folder = builders()["llama"](tiny_models_dir / "borrow-llama")
    assert lent(candidate(folder, "float32"), folder) is None  # a float32 candidate
    assert lendable(candidate(folder), str(folder), torch.float16) is None  # another honest dtype
    other = build_tiny_llama(tiny_models_dir / "borrow-llama-other", seed=5, lm_head_scale=20.0)
    assert lent(candidate(other), folder) is None  # another checkpoint's weights
    f32 = build_tiny_llama(tiny_models_dir / "borrow-llama-f32", seed=4, dtype="float32")
    assert lent(candidate(f32), f32) is None  # stored in float32: a bf16 load has rounded them
    assert lent(object(), folder) is None  # not built on the HF engine
    copy = tiny_models_dir / "borrow-llama-copy"
    shutil.copytree(folder, copy, dirs_exist_ok=True)
    assert lent(candidate(folder), copy) is not None  # the same bytes in another folder: lent
    header = next(copy.glob("*.safetensors"))
    data = bytearray(header.read_bytes())
    data[-1] ^= 1  # the last stored byte changed
    header.write_bytes(bytes(data))
    assert lent(candidate(folder), copy) is None


def test_stacked_experts_are_checked_as_views_of_their_rows(
    tiny_models_dir: Path, threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 256 experts' stacked weights are compared row block by row block with the stored
    per-expert tensors, never through transformers' reverse mapping with their data (its
    reverse copies them: at 256 experts a third of the check); lent as before, and a swapped
    gate and up projection of one expert is not the checkpoint's."""
    import torch
    import transformers.core_model_loading as loading

    folder = builders()["qwen3.5-moe-256"](tiny_models_dir / "borrow-qwen3.5-moe-256")
    eng = candidate(folder)
    real = loading.revert_weight_conversion
    reverted: list[tuple[str, str]] = []

    def watched(model: Any, state_dict: dict[str, Any]) -> Any:
        reverted.extend((name, t.device.type) for name, t in state_dict.items() if ".experts." in name)
        return real(model, state_dict)

    monkeypatch.setattr(loading, "revert_weight_conversion", watched)
    assert lent(eng, folder) is not None
    stacked = {n for n, p in eng.model.named_parameters() if ".experts." in n and p.ndim == 3}
    assert len(stacked) == 2 * eng.model.config.num_hidden_layers
    assert {n for n, _ in reverted} == stacked and {d for _, d in reverted} == {"meta"}
    experts = next(m for m in eng.model.modules() if type(m).__name__.endswith("Experts"))
    half = experts.gate_up_proj.shape[1] // 2
    with torch.no_grad():
        row = experts.gate_up_proj.data[7]
        row.copy_(torch.cat([row[half:], row[:half]]))  # expert 7's up projection where its gate is
    assert lent(eng, folder) is None


def test_the_check_leaves_nothing_mapped_nor_resident(
    tiny_models_dir: Path, threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check reads the files through a mapping: closed when it returns, whether it lends or
    not, and each tensor's pages out of the resident set once compared (a mapping left open
    holds a 70 GB checkpoint's pages in the process's RSS)."""
    import gc
    import mmap

    from gate.engines.hf import borrow

    folder = builders()["qwen3.5-moe-256"](tiny_models_dir / "borrow-qwen3.5-moe-256")
    eng = candidate(folder)
    stored = str(next(folder.glob("*.safetensors")).resolve())

    def mapped() -> int:
        return sum(stored in line for line in Path("/proc/self/maps").read_text().splitlines())

    made: list[mmap.mmap] = []
    advised: list[int] = []
    real = mmap.mmap.madvise

    class Watched(mmap.mmap):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(self)

        def madvise(self, option: int, start: int = 0, length: int = 0) -> None:
            advised.append(length)
            real(self, option, start, length)

    monkeypatch.setattr(borrow.mmap, "mmap", Watched)
    gc.collect()  # an earlier test's engines, mapping the same file, gone before counting
    before = mapped()
    assert lent(eng, folder) is not None
    assert made and all(m.closed for m in made) and mapped() <= before
    # Every stored byte let go again: the lengths cover the file's tensors.
    assert sum(advised) >= sum(p.numel() * p.element_size() for p in eng.model.parameters())
    made.clear()
    eng.model.model.norm.weight.data.add_(0.5)
    assert lent(eng, folder) is None and made and all(m.closed for m in made) and mapped() <= before


def test_a_diagnosis_says_where_its_honest_weights_came_from(threads: None) -> None:
    """On gate's Qwen3.6 test checkpoint: the HF engine as the candidate lends its weights and
    the diagnosis says so; a candidate with an altered expert does not, and the diagnosis
    locates the alteration at that layer's experts."""
    from gate.core.pins.pin import load_pin
    from gate.models.qwen_tiny import QWEN_TINY, qwen_tiny_dir
    from gate.workflows.diagnose.core import LENT, diagnose_engine, target_given

    pin = load_pin(QWEN_TINY)
    target = target_given(pin, "code-numpy", 12)
    path = str(qwen_tiny_dir())
    eng = candidate(qwen_tiny_dir())
    d = diagnose_engine(eng, target, path, cache=False)
    assert d.engines["honest"]["weights"] == LENT and d.engines["reference"]["weights"] == LENT
    assert any("candidate's loaded weights" in n for n in d.notes)
    assert d.finding.first is None  # the honest engine on its own weights: nothing leaves the band
    layer = 1
    experts = [m for m in eng.model.modules() if type(m).__name__.endswith("Experts")][layer]
    experts.down_proj.data.mul_(1.25)  # every expert of one layer's MoE block
    d = diagnose_engine(eng, target, path, cache=False)
    assert "weights" not in d.engines["honest"] and not any("candidate's loaded weights" in n for n in d.notes)
    assert d.finding.first is not None and d.finding.first.layer == layer
    assert d.finding.first.part.startswith("experts"), d.finding.first.part


def test_the_honest_config_is_autoconfigs_and_its_build_leaves_reprs_and_loading_as_they_were(
    tiny_models_dir: Path, threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The honest engine's config is built with configs' repr made terse (huggingface_hub's
    union checks format whole configs into messages they drop) and its model loaded without
    transformers' thread pool (the weights are in memory) nor torch's initialisers (the lent
    weights replace what they would draw): the config is AutoConfig's, and repr, the
    environment and torch's initialisers are the caller's again after, a failed build included."""
    import json
    import os

    from transformers import AutoConfig, PretrainedConfig

    from gate.engines.hf import borrow

    folder = builders()["qwen3.5-moe-hybrid"](tiny_models_dir / "borrow-qwen3.5-moe-hybrid")
    own = PretrainedConfig.__repr__
    built = borrow._config(str(folder))
    assert built.to_dict() == AutoConfig.from_pretrained(str(folder)).to_dict()
    assert PretrainedConfig.__repr__ is own and repr(built).startswith(f"{type(built).__name__} {{")
    from gate.models.qwen_tiny import qwen_tiny_dir

    qwen = str(qwen_tiny_dir())  # the multimodal layout: a text and a vision config inside
    multimodal = borrow._config(qwen)
    assert multimodal.to_dict() == AutoConfig.from_pretrained(qwen).to_dict() and multimodal.vision_config is not None
    bad = tiny_models_dir / "borrow-bad-config"
    shutil.copytree(folder, bad, dirs_exist_ok=True)
    config = json.loads((bad / "config.json").read_text())
    config.get("text_config", config)["num_experts_per_tok"] = "eight"
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception, match="num_experts_per_tok"):
        borrow._config(str(bad))
    assert PretrainedConfig.__repr__ is own
    monkeypatch.setenv(borrow.ASYNC_OFF, "no")
    seen: list[str | None] = []
    real = borrow._config

    def watched(path: str) -> Any:
        seen.append(os.environ.get(borrow.ASYNC_OFF))
        return real(path)

    monkeypatch.setattr(borrow, "_config", watched)
    eng = candidate(folder)
    weights = lent(eng, folder)
    assert weights is not None
    import transformers.core_model_loading as loading

    threads_off: list[bool] = []
    real_load = loading.convert_and_load_state_dict_in_model

    def load_watched(*args: Any, **kwargs: Any) -> Any:
        threads_off.append(os.environ.get(borrow.ASYNC_OFF) == "1")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(loading, "convert_and_load_state_dict_in_model", load_watched)
    import transformers.modeling_utils as modeling

    if getattr(modeling, "convert_and_load_state_dict_in_model", None) is real_load:
        monkeypatch.setattr(modeling, "convert_and_load_state_dict_in_model", load_watched)
    import torch

    drawn: list[str] = []  # a Linear's __init__ draws its weights through torch.nn.init
    real_kaiming = torch.nn.init.kaiming_uniform_

    def kaiming_watched(*args: Any, **kwargs: Any) -> Any:
        drawn.append("kaiming_uniform_")
        return real_kaiming(*args, **kwargs)

    monkeypatch.setattr(torch.nn.init, "kaiming_uniform_", kaiming_watched)
    torch.nn.Linear(2, 2)
    assert drawn == ["kaiming_uniform_"]  # the watch sees a Linear's draw
    drawn.clear()
    borrow.built_around(str(folder), weights, {"dtype": eng.dtype})
    assert threads_off == [True] and seen == ["no"] and os.environ[borrow.ASYNC_OFF] == "no"
    # No torch initialiser drew into the meta tensors the lent weights replace, and they are
    # torch's again after the build.
    assert drawn == [] and torch.nn.init.kaiming_uniform_ is kaiming_watched
